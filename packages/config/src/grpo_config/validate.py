"""Cross-field checks, run by `load` before anything heavy starts. Every problem says what to change."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from collections.abc import Callable
from typing import Any

from grpo_config.aliases import TRANSFORMER_SETTINGS
from grpo_config.errors import ConfigError
from grpo_config.rejection import parse_is_threshold, parse_rejection
from grpo_config.schema import (
    ActorConfig,
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    MegatronConfig,
    OverlongBufferConfig,
    ParallelConfig,
    RefMegatronConfig,
    RewardConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    TimeoutsConfig,
    TrainerConfig,
)

_TIMEOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TimeoutsConfig)}


def _positive(cfg: TrainerConfig) -> dict[str, int]:
    sizes = {
        "device.nnodes": cfg.device.nnodes,
        "device.devices_per_node": cfg.device.devices_per_node,
        "data.train_batch_size": cfg.data.train_batch_size,
        "actor.ppo_mini_batch_size": cfg.actor.ppo_mini_batch_size,
        "actor.ppo_micro_batch_size_per_device": cfg.actor.ppo_micro_batch_size_per_device,
        "actor.log_prob_micro_batch_size_per_device": cfg.actor.log_prob_micro_batch_size_per_device,
        "rollout.n": cfg.rollout.n,
        "rollout.tensor_parallel_size": cfg.rollout.tensor_parallel_size,
    }
    for prefix, par in (("parallel", cfg.parallel), ("ref.parallel", cfg.ref.parallel)):
        if par is None:
            continue
        sizes.update({f"{prefix}.{name}": getattr(par, name) for name in ("tp", "pp", "ep", "etp", "cp")})
        if par.vpp is not None:
            sizes[f"{prefix}.vpp"] = par.vpp
    if cfg.ref.log_prob_micro_batch_size_per_device is not None:
        sizes["ref.log_prob_micro_batch_size_per_device"] = cfg.ref.log_prob_micro_batch_size_per_device
    return sizes


def _parallel_problems(par: ParallelConfig, *, prefix: str, world: int, num_experts: int | None) -> list[str]:
    problems: list[str] = []
    model_parallel = par.tp * par.pp * par.cp
    if world % model_parallel:
        problems.append(
            f"{prefix}.tp * {prefix}.pp * {prefix}.cp = {par.tp}*{par.pp}*{par.cp} = {model_parallel} does "
            f"not divide the world size {world} (device.nnodes * device.devices_per_node): choose sizes "
            f"whose product divides {world}."
        )
    if world % par.pp == 0 and (world // par.pp) % (par.ep * par.etp):
        problems.append(
            f"{prefix}.ep * {prefix}.etp = {par.ep}*{par.etp} = {par.ep * par.etp} does not divide the "
            f"devices per pipeline stage, world // {prefix}.pp = {world}//{par.pp} = {world // par.pp}: "
            f"lower {prefix}.ep or {prefix}.etp to a divisor of {world // par.pp}."
        )
    if num_experts is not None and num_experts % par.ep:
        problems.append(
            f"{prefix}.ep={par.ep} does not divide the model's {num_experts} experts: set {prefix}.ep "
            f"to a divisor of {num_experts}."
        )
    if par.vpp is not None and par.pp == 1:
        problems.append(
            f"{prefix}.vpp={par.vpp} needs pipeline parallelism: set {prefix}.pp > 1 or {prefix}.vpp=null."
        )
    return problems


def _batch_problems(cfg: TrainerConfig, *, world: int) -> list[str]:
    problems: list[str] = []
    train, mini = cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size
    if train % mini:
        problems.append(
            f"data.train_batch_size={train} is not divisible by actor.ppo_mini_batch_size={mini}: make "
            f"data.train_batch_size a multiple of {mini} or actor.ppo_mini_batch_size a divisor of {train}."
        )
    par = cfg.parallel
    if world % (par.tp * par.pp * par.cp):
        return problems  # data parallel size undefined; reported by the parallel check
    dp = world // (par.tp * par.pp * par.cp)
    micro = 1 if cfg.actor.use_dynamic_bsz else cfg.actor.ppo_micro_batch_size_per_device
    sequences = mini * cfg.rollout.n
    if sequences % (micro * dp):
        what = (
            "data parallel size"
            if cfg.actor.use_dynamic_bsz
            else f"actor.ppo_micro_batch_size_per_device * data parallel size = {micro}*{dp}"
        )
        problems.append(
            f"actor.ppo_mini_batch_size * rollout.n = {mini}*{cfg.rollout.n} = {sequences} sequences per "
            f"mini batch is not divisible by {what} = {micro * dp} (data parallel size = world {world} "
            f"// (parallel.tp*pp*cp) {par.tp * par.pp * par.cp}): change actor.ppo_mini_batch_size, "
            f"rollout.n or actor.ppo_micro_batch_size_per_device."
        )
    if cfg.actor.backend == "megatron" and par.pp > 1:
        problems += _pipeline_problems(cfg, dp=dp)
    return problems


def _pipeline_problems(cfg: TrainerConfig, *, dp: int) -> list[str]:
    """Pipeline stages exchange activations of one fixed shape: every micro-batch must have the
    same number of rows (widths are padded to the batch's longest row)."""
    policy_log_probs = not cfg.algorithm.rollout_correction.bypass_mode or cfg.uses_reference_model
    dynamic = [
        key
        for key, on in (
            ("actor.use_dynamic_bsz", cfg.actor.use_dynamic_bsz),
            ("actor.log_prob_use_dynamic_bsz", cfg.actor.log_prob_use_dynamic_bsz and policy_log_probs),
            ("ref.log_prob_use_dynamic_bsz", cfg.ref.log_prob_use_dynamic_bsz and cfg.uses_reference_model),
        )
        if on
    ]
    if dynamic:
        return [
            f"{' and '.join(f'{key}=true' for key in dynamic)} with parallel.pp={cfg.parallel.pp} is not "
            "supported: pipeline stages need micro-batches of one row count. Set "
            f"{' and '.join(f'{key}=false' for key in dynamic)} (micro-batches of "
            "actor.ppo_micro_batch_size_per_device / log_prob_micro_batch_size_per_device rows) or "
            "parallel.pp=1."
        ]
    rows = cfg.data.train_batch_size * cfg.rollout.n // dp  # one data-parallel rank's rows per step
    sizes = {"actor.log_prob_micro_batch_size_per_device": cfg.actor.log_prob_micro_batch_size_per_device} if policy_log_probs else {}
    if cfg.ref.log_prob_micro_batch_size_per_device is not None and cfg.uses_reference_model:
        sizes["ref.log_prob_micro_batch_size_per_device"] = cfg.ref.log_prob_micro_batch_size_per_device
    problems = [
        f"{key}={size} does not divide the {rows} rows each data-parallel rank computes log-probs for "
        f"(data.train_batch_size * rollout.n // data parallel size {dp}); with parallel.pp="
        f"{cfg.parallel.pp} every micro-batch needs the same row count: choose a divisor of {rows}."
        for key, size in sizes.items()
        if rows % size
    ]
    if problems or not (cfg.parallel.vpp and cfg.parallel.vpp > 1):
        return problems
    return _interleaving_problems(cfg, dp=dp, log_prob_sizes=sizes, rows=rows)


def _interleaving_problems(cfg: TrainerConfig, *, dp: int, log_prob_sizes: dict[str, int], rows: int) -> list[str]:
    """megatron-core's interleaved schedule (parallel.vpp > 1) runs micro-batches in groups of PP:
    every pass needs a multiple of PP micro-batches (it raises otherwise)."""
    pp = cfg.parallel.pp
    counts = {"actor.ppo_micro_batch_size_per_device": (
        cfg.actor.ppo_mini_batch_size * cfg.rollout.n // dp // cfg.actor.ppo_micro_batch_size_per_device,
        "an update's",
    )}
    counts.update({key: (rows // size, "a log-prob pass's") for key, size in log_prob_sizes.items()})
    return [
        f"{key}={_value_of(cfg, key)} makes {count} micro-batches in {what} pipeline, not a multiple of "
        f"parallel.pp={pp}: with parallel.vpp={cfg.parallel.vpp} megatron-core's interleaved schedule runs "
        f"micro-batches in groups of {pp}. Choose a micro-batch size that gives a multiple of {pp}, or parallel.vpp=null."
        for key, (count, what) in counts.items()
        if count % pp
    ]


def _value_of(cfg: TrainerConfig, key: str) -> int:
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)


_FOLDER_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")

# (dotted key, test of the value, what the value must be): each checked on the resolved config.
_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("actor.lr", lambda v: v > 0, "a positive learning rate, e.g. 1e-6"),
    ("actor.lr_warmup_steps", lambda v: v >= 0, ">= 0 steps"),
    ("actor.weight_decay", lambda v: v >= 0, ">= 0"),
    ("actor.grad_clip", lambda v: v > 0, "a positive gradient-norm bound, e.g. 1.0"),
    ("actor.ppo_epochs", lambda v: v >= 1, ">= 1"),
    ("actor.ppo_max_token_len_per_device", lambda v: v >= 1, ">= 1 tokens"),
    ("actor.log_prob_max_token_len_per_device", lambda v: v >= 1, ">= 1 tokens"),
    ("ref.log_prob_max_token_len_per_device", lambda v: v >= 1, ">= 1 tokens"),
    ("actor.clip_ratio_low", lambda v: v >= 0, ">= 0 (PPO clips the ratio to [1 - low, 1 + high])"),
    ("actor.clip_ratio_high", lambda v: v >= 0, ">= 0 (PPO clips the ratio to [1 - low, 1 + high])"),
    ("actor.loss_scale_factor", lambda v: v is None or v > 0, "positive, or null for the response budget"),
    ("actor.clip_ratio_c", lambda v: v > 1, "greater than 1 (dual-clip lower bound of the PPO loss), e.g. 3.0"),
    ("actor.kl_loss_coef", lambda v: v >= 0, ">= 0"),
    ("actor.megatron.optimizer_offload_fraction", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("actor.megatron.moe_aux_loss_coeff", lambda v: v >= 0, ">= 0"),
    ("actor.megatron.moe_z_loss_coeff", lambda v: v >= 0, ">= 0"),
    ("data.max_prompt_length", lambda v: v >= 1, ">= 1 tokens"),
    ("data.max_response_length", lambda v: v >= 1, ">= 1 tokens"),
    ("rollout.temperature", lambda v: v >= 0, ">= 0 (0 is greedy)"),
    ("rollout.val_temperature", lambda v: v >= 0, ">= 0 (0 is greedy)"),
    ("rollout.top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("rollout.top_k", lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    ("rollout.val_top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("rollout.val_top_k", lambda v: v == -1 or v >= 1, "-1 (off) or >= 1"),
    ("rollout.max_tokens", lambda v: v is None or v >= 1, ">= 1 or null (data.max_response_length)"),
    ("rollout.gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1], e.g. 0.6"),
    ("rollout.max_model_len", lambda v: v is None or v >= 1, ">= 1 or null"),
    ("rollout.max_num_batched_tokens", lambda v: v >= 1, ">= 1"),
    ("rollout.weight_sync_bucket_mb", lambda v: v >= 1, ">= 1 MB"),
    ("rollout.val_n", lambda v: v >= 1, ">= 1"),
    ("algorithm.adv_eps", lambda v: v > 0, "> 0 (added to the group's standard deviation), e.g. 1e-6"),
    ("algorithm.kl_ctrl.kl_coef", lambda v: v >= 0, ">= 0"),
    ("algorithm.kl_ctrl.horizon", lambda v: v >= 1, ">= 1 sequences"),
    ("algorithm.kl_ctrl.target_kl", lambda v: v > 0, "> 0"),
    ("data.gen_batch_size", lambda v: v is None or v >= 1, ">= 1 prompts or null (data.train_batch_size)"),
    ("reward.overlong_buffer.len", lambda v: v >= 0, ">= 0 tokens"),
    ("reward.overlong_buffer.penalty_factor", lambda v: v >= 0, ">= 0"),
    ("reward.overlong_buffer.max_response_length", lambda v: v is None or v >= 1, ">= 1 tokens or null (the budget)"),
    ("logging.val_generations", lambda v: v >= 0, ">= 0 samples (0: none)"),
    ("reward.timeout_s", lambda v: v > 0, "> 0 seconds"),
    ("reward.num_workers", lambda v: v >= 1, ">= 1"),
    ("checkpoint.save_freq", lambda v: v == -1 or v >= 1, "-1 (only at the end) or >= 1 steps"),
    ("checkpoint.max_to_keep", lambda v: v is None or v >= 1, ">= 1 or null (keep all)"),
    ("test_freq", lambda v: v == -1 or v >= 1, "-1 (never) or >= 1 steps"),
    ("total_epochs", lambda v: v >= 1, ">= 1"),
    ("total_training_steps", lambda v: v is None or v >= 1, ">= 1 or null (total_epochs decides)"),
    ("timeouts.collective_s", lambda v: v is None or 0 < v < math.inf, "a positive, finite number of seconds or null"),
)

# (dotted key, a value we cannot honour yet, why, what to do instead).
_NOT_YET: tuple[tuple[str, Any, str], ...] = (
    (
        "actor.megatron.use_dist_checkpointing",
        True,
        "grpo saves the Megatron state as one file per rank plus the HF export (checkpoint.export_hf); "
        "megatron-core distributed (torch_dist) checkpoints are not written or read. Set it to false",
    ),
    (
        "ref.megatron.use_dist_checkpointing",
        True,
        "the reference model is loaded from its HF checkpoint (ref.model_path); set it to false",
    ),
    (
        "actor.kl_loss_type",
        "full",
        "the full KL needs both models' whole vocabulary distributions at every token, which neither "
        "grpo nor verl keeps (verl raises NotImplementedError for it); use low_var_kl (k3), k1/kl, "
        "k2/mse or abs, or one of them with '+' for the k2 gradient",
    ),
    (
        "algorithm.kl_penalty",
        "full",
        "the full KL needs both models' whole vocabulary distributions at every token, which neither "
        "grpo nor verl keeps; use kl (k1, verl's default here), low_var_kl (k3), mse (k2) or abs",
    ),
)


def _lookup(cfg: TrainerConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


# megatron-core OptimizerConfig fields that grpo sets from its own settings.
_OPTIMIZER_SETTINGS: dict[str, str] = {
    "lr": "actor.lr",
    "min_lr": "actor.lr",
    "weight_decay": "actor.weight_decay",
    "clip_grad": "actor.grad_clip",
    "bf16": "actor.dtype",
    "fp16": "actor.dtype",
    "params_dtype": "actor.dtype",
    "use_distributed_optimizer": "actor.megatron.use_distributed_optimizer",
    "optimizer_offload_fraction": "actor.megatron.optimizer_offload_fraction",
}


# vllm.LLM arguments that grpo sets from its own settings.
_ENGINE_SETTINGS: dict[str, str] = {
    "model": "actor.model_path",
    "dtype": "rollout.dtype",
    "tensor_parallel_size": "rollout.tensor_parallel_size",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "enforce_eager": "rollout.enforce_eager",
    "max_model_len": "rollout.max_model_len",
    "max_num_batched_tokens": "rollout.max_num_batched_tokens",
    "enable_sleep_mode": "rollout.free_cache_engine",
    "seed": "seed",
    "trust_remote_code": "actor.trust_remote_code",
    "distributed_executor_backend": "rollout.tensor_parallel_size (replicas over the training ranks)",
}


def _override_problems(cfg: TrainerConfig) -> list[str]:
    """An override dict may not set what a grpo setting sets: two places for one value."""
    problems: list[str] = []
    for section in ("actor", "ref"):
        megatron = getattr(cfg, section).megatron
        if section == "ref" and megatron == cfg.actor.megatron:
            continue
        problems += [
            f"{section}.megatron.override_transformer_config.{name} is a grpo setting of its own: set "
            f"{section}.megatron.{name} instead."
            for name in megatron.override_transformer_config
            if name in TRANSFORMER_SETTINGS
        ]
    engine_kwargs = cfg.rollout.engine_kwargs
    if engine_kwargs and cfg.rollout.engine != "vllm":
        problems.append(
            f"rollout.engine_kwargs={engine_kwargs} are vllm.LLM arguments; rollout.engine="
            f"{cfg.rollout.engine} takes none. Remove them or set rollout.engine=vllm."
        )
    problems += [
        f"rollout.engine_kwargs.{name} is set by grpo from {ours}: set {ours} instead."
        for name in engine_kwargs
        if (ours := _ENGINE_SETTINGS.get(name))
    ]
    if cfg.actor.backend == "megatron" and cfg.ref.dtype not in (None, cfg.actor.dtype):
        problems.append(
            f"ref.dtype={cfg.ref.dtype} differs from actor.dtype={cfg.actor.dtype}: the Megatron "
            f"backend builds the reference model in actor.dtype. Unset ref.dtype."
        )
    problems += [
        f"actor.megatron.override_optimizer_config.{name} is set by grpo from {ours}: set {ours} instead."
        for name in cfg.actor.megatron.override_optimizer_config
        if (ours := _OPTIMIZER_SETTINGS.get(name))
    ]
    return problems


# Settings read by one backend / rollout engine only: set to anything but the default with the
# other, they would be accepted and ignored.
_VLLM_ONLY = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "max_model_len",
    "max_num_batched_tokens",
    "free_cache_engine",
    "weight_sync_bucket_mb",
)


_LOG_PROB_SETTINGS = ("log_prob_micro_batch_size_per_device", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_device")


def _changed(section: Any, default: Any, names: Any, prefix: str) -> list[str]:
    return [
        f"{prefix}.{name}={getattr(section, name)!r}"
        for name in names
        if getattr(section, name) != getattr(default, name)
    ]


def _megatron_reference_problems(cfg: TrainerConfig) -> list[str]:
    problems: list[str] = []
    if cfg.ref.parallel not in (None, cfg.parallel):
        names = [f.name for f in dataclasses.fields(ParallelConfig)]
        problems.append(
            f"{', '.join(_changed(cfg.ref.parallel, cfg.parallel, names, 'ref.parallel'))}: ref.parallel differs "
            "from parallel: the Megatron reference model shares the actor's parallel layout (one set of "
            "process groups). Remove ref.parallel (it inherits parallel)."
        )
    if cfg.parallel.cp > 1:
        problems.append(
            f"parallel.cp={cfg.parallel.cp}: context parallelism is not supported by the Megatron "
            f"backend's log-prob path yet. Set parallel.cp=1."
        )
    return problems


def _unread_problems(cfg: TrainerConfig) -> list[str]:
    problems: list[str] = []
    if cfg.actor.backend == "torch":
        changed = _changed(cfg.parallel, ParallelConfig(), [f.name for f in dataclasses.fields(ParallelConfig)], "parallel")
        changed += _changed(
            cfg.actor.megatron, MegatronConfig(), [f.name for f in dataclasses.fields(MegatronConfig)], "actor.megatron"
        )
        if cfg.ref.megatron not in (None, RefMegatronConfig.of_actor(cfg.actor.megatron)):
            changed.append("ref.megatron")
        if cfg.ref.parallel not in (None, cfg.parallel):
            changed.append("ref.parallel")
        if changed:
            problems.append(
                f"{', '.join(changed)}: read by the Megatron backend only, and actor.backend=torch (data "
                f"parallel over every device, no model parallelism). Remove them or set actor.backend=megatron."
            )
    if cfg.actor.backend == "megatron":
        problems += _megatron_reference_problems(cfg)
        problems += [
            f"{key}=True cannot be honoured on the Megatron backend yet: packed (padding-free) rows need "
            "a core attention that takes sequence boundaries (transformer_engine's, or one not written "
            "for the local layers) and Qwen3.5's Gated DeltaNet trains packed only with FLA's kernels "
            "on Triton >= 3.7.1. Set it to false (rows are padded: the same results, slower) or use "
            "actor.backend=torch, which packs."
            for key, value in (
                ("actor.use_remove_padding", cfg.actor.use_remove_padding),
                # the reference inherits the actor's setting: named once
                ("ref.use_remove_padding", cfg.ref.use_remove_padding and not cfg.actor.use_remove_padding),
            )
            if value
        ]
    return problems


def _algorithm_problems(cfg: TrainerConfig) -> list[str]:
    """Settings of one algorithm set while that algorithm is off (accepted and ignored otherwise),
    and combinations with no defined meaning."""
    algorithm, problems = cfg.algorithm, []
    if algorithm.use_kl_in_reward and algorithm.kl_penalty.endswith("+"):
        problems.append(
            f"algorithm.kl_penalty={algorithm.kl_penalty}: a '+' estimator differs from its base only in the "
            f"gradient, and a reward has none. Use {algorithm.kl_penalty[:-1]}."
        )
    groups = algorithm.filter_groups
    if groups.enable and groups.metric == "seq_final_reward" and algorithm.use_kl_in_reward:
        problems.append(
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: groups are "
            "filtered before the log-prob passes that the KL penalty needs. Filter on seq_reward or acc."
        )
    correction = algorithm.rollout_correction
    if correction.bypass_mode and (correction.rollout_is is not None or correction.rollout_rs is not None):
        problems.append(
            "algorithm.rollout_correction.bypass_mode=true with rollout_is / rollout_rs is not implemented: grpo's "
            "weights and rejections act on the gap between the old log-probs and the engine's, which bypass mode "
            "makes the same tensor (verl weights pi_theta / pi_rollout there instead). Remove rollout_is / "
            "rollout_rs, or set bypass_mode=false (the old log-probs recomputed)."
        )
    if correction.bypass_mode and not cfg.uses_reference_model:
        unread = _changed(cfg.actor, ActorConfig(), _LOG_PROB_SETTINGS, "actor")
        if unread:
            problems.append(
                f"{', '.join(unread)}: read by the policy's log-prob pass, which bypass_mode=true skips, and no "
                "reference model runs one (no KL loss, no KL in the reward). Remove them or set bypass_mode=false."
            )
    logprobs_mode = cfg.rollout.engine_kwargs.get("logprobs_mode", "raw_logprobs")
    if correction.bypass_mode and cfg.rollout.engine == "vllm" and logprobs_mode != "raw_logprobs":
        problems.append(
            f"algorithm.rollout_correction.bypass_mode=true with rollout.engine_kwargs.logprobs_mode={logprobs_mode}: "
            "those log-probs are of the distribution after temperature / top-k / top-p, the policy's in the "
            "loss are of the raw one. Use raw_logprobs (vLLM's default) or set bypass_mode=false."
        )
    try:
        parse_is_threshold(correction.rollout_is_threshold)
    except ValueError as exc:
        problems.append(f"algorithm.rollout_correction.{exc}.")
    if correction.rollout_rs is not None:
        try:
            parse_rejection(correction.rollout_rs, correction.rollout_rs_threshold)
        except ValueError as exc:
            problems.append(f"algorithm.rollout_correction: {exc}.")
    buffer = cfg.reward.overlong_buffer
    if buffer.enable and buffer.max_response_length is not None:
        if not 1 <= buffer.len <= buffer.max_response_length:
            problems.append(
                f"reward.overlong_buffer.len={buffer.len} must be between 1 and reward.overlong_buffer."
                f"max_response_length={buffer.max_response_length} (verl's max_resp_len): the penalty ramps over "
                "the last len tokens before it."
            )
    elif buffer.enable and not 1 <= buffer.len <= (cfg.rollout.max_tokens or cfg.data.max_response_length):
        budget = cfg.rollout.max_tokens or cfg.data.max_response_length
        problems.append(
            f"reward.overlong_buffer.len={buffer.len} must be between 1 and the response budget {budget} "
            "(rollout.max_tokens, else data.max_response_length): the penalty ramps over the last len tokens."
        )
    if cfg.logging.wandb and importlib.util.find_spec("wandb") is None:
        problems.append(
            "logging.wandb=true (trainer.logger 'wandb') needs the wandb package, which is not installed here: "
            "`pip install wandb` (or `pip install grpo-trainer[wandb]`), or drop 'wandb' from trainer.logger."
        )
    return problems + _policy_loss_problems(cfg)


def _policy_loss_problems(cfg: TrainerConfig) -> list[str]:
    actor, problems = cfg.actor, []
    mode = actor.policy_loss.loss_mode
    if mode != "cispo" and actor.clip_ratio_low > 1:
        problems.append(
            f"actor.clip_ratio_low={actor.clip_ratio_low} makes the ratio's lower clip bound 1 - low negative; "
            "only actor.policy_loss.loss_mode=cispo takes a large low (no lower bound). Use a value <= 1."
        )
    return problems


def value_problems(cfg: TrainerConfig) -> list[str]:
    """Problems of single values (ranges, values grpo cannot honour, overrides of grpo settings)."""
    problems: list[str] = []
    for key, ok, expected in _RANGES:
        value = _lookup(cfg, key)
        if _not_finite(value) or not ok(value):
            problems.append(f"{key}={value} is out of range: it must be {expected}.")
    for key, refused, why in _NOT_YET:
        inherited = key.startswith("ref.") and _lookup(cfg, "actor." + key[4:]) == refused
        if _lookup(cfg, key) == refused and not inherited:
            problems.append(f"{key}={refused} cannot be honoured: {why}.")
    problems += _override_problems(cfg)
    problems += _unread_problems(cfg)
    problems += _algorithm_problems(cfg)
    problems += [
        f"{key}={name!r} names a folder (<logging.dir>/<project_name>/<experiment_name>): use letters, "
        f"digits, '.', '_' or '-', not starting with '.'."
        for key, name in (("project_name", cfg.project_name), ("experiment_name", cfg.experiment_name))
        if not _FOLDER_NAME.fullmatch(name)
    ]
    if cfg.max_zero_advantage_steps < 0:
        problems.append(
            f"max_zero_advantage_steps={cfg.max_zero_advantage_steps} must be >= 0 (0: never stop for "
            "steps whose advantages are all zero)."
        )
    for name, default in _TIMEOUT_DEFAULTS.items():
        seconds = getattr(cfg.timeouts, name)
        if default is not None and not 0.0 < seconds < math.inf:
            problems.append(
                f"timeouts.{name}={seconds} must be a positive, finite number of seconds (how long the "
                f"driver waits for every rank in that phase before it stops the run): set "
                f"timeouts.{name} to e.g. {default:g}."
            )
    return problems


def _recompute_problems(cfg: TrainerConfig) -> list[str]:
    megatron = cfg.actor.megatron
    if cfg.actor.backend != "megatron" or megatron.recompute_granularity:
        return []
    if cfg.actor.gradient_checkpointing:
        return [
            "actor.gradient_checkpointing=true with the Megatron backend is activation recompute: set "
            "actor.megatron.recompute_granularity (full or selective), recompute_method and "
            "recompute_num_layers, e.g. full / uniform / 1."
        ]
    orphans = [
        f"actor.megatron.{name}={getattr(megatron, name)}"
        for name in ("recompute_method", "recompute_num_layers")
        if getattr(megatron, name) is not None
    ]
    if orphans:
        return [
            f"{', '.join(orphans)} without actor.megatron.recompute_granularity recomputes nothing: set "
            "recompute_granularity (full or selective) or remove them."
        ]
    return []


def _one_step_off_problems(cfg: TrainerConfig) -> list[str]:
    """rollout.mode=one_step_off: rollout workers of their own, one update behind the policy."""
    rollout = cfg.rollout
    if rollout.mode == "sync":
        if rollout.devices_per_node != 0 or rollout.nnodes != 1:
            return [
                f"rollout.nnodes={rollout.nnodes} / rollout.devices_per_node={rollout.devices_per_node} give the "
                "rollout workers devices of their own, which only rollout.mode=one_step_off uses (in sync mode "
                "the engines share the training ranks' devices): set rollout.mode=one_step_off, or "
                "rollout.nnodes=1 and rollout.devices_per_node=0."
            ]
        return []
    problems: list[str] = []
    if rollout.devices_per_node < 1 or rollout.nnodes < 1:
        problems.append(
            f"rollout.mode=one_step_off needs rollout workers on devices of their own: set "
            f"rollout.devices_per_node >= 1 and rollout.nnodes >= 1 (got {rollout.devices_per_node} and "
            f"{rollout.nnodes}; verl's rollout.n_gpus_per_node / rollout.nnodes)."
        )
    if rollout.tensor_parallel_size != 1:
        problems.append(
            f"rollout.tensor_parallel_size={rollout.tensor_parallel_size} with rollout.mode=one_step_off: a "
            "rollout worker is one engine on one device in this mode (tensor-parallel rollout workers are "
            "not implemented). Set rollout.tensor_parallel_size=1 or rollout.mode=sync."
        )
    correction = cfg.algorithm.rollout_correction
    if correction.rollout_is is None and not correction.bypass_mode:
        problems.append(
            "rollout.mode=one_step_off trains on responses sampled with the weights from before the previous "
            "update, so the importance weights of algorithm.rollout_correction are needed: set "
            "algorithm.rollout_correction.rollout_is=token (or sequence), or bypass_mode=true (the PPO ratio "
            "then is taken against the rollout engine's own log-probs)."
        )
    if cfg.algorithm.filter_groups.enable:
        problems.append(
            "algorithm.filter_groups.enable=true with rollout.mode=one_step_off: dynamic sampling's further "
            "generation rounds would come from a policy of another age than the first; it is not implemented "
            "with one-step-off rollout. Set one of them off."
        )
    if rollout.engine == "vllm" and rollout.free_cache_engine:
        problems.append(
            "rollout.free_cache_engine=true puts a colocated vLLM engine to sleep between rollouts to free its "
            "device for training; with rollout.mode=one_step_off the engine has devices of its own and keeps "
            "generating. Set rollout.free_cache_engine=false."
        )
    if cfg.actor.backend == "megatron":
        megatron = cfg.actor.megatron
        offloads = [
            f"actor.megatron.{name}=true"
            for name in ("param_offload", "grad_offload", "optimizer_offload")
            if getattr(megatron, name)
        ]
        if offloads:
            problems.append(
                f"{', '.join(offloads)}: offload frees the training devices for a colocated rollout engine; "
                "with rollout.mode=one_step_off the engine has devices of its own, so nothing would use the "
                "freed memory. Set them to false (actor.megatron.optimizer_offload_fraction still offloads "
                "the optimizer step itself)."
            )
    return problems


def _replica_problems(cfg: TrainerConfig) -> list[str]:
    """A rollout replica spans `rollout.tensor_parallel_size` consecutive ranks of one node."""
    if cfg.rollout.mode == "one_step_off":
        return []  # one engine per rollout device (checked in _one_step_off_problems)
    k = cfg.rollout.tensor_parallel_size
    per_node = cfg.device.devices_per_node
    world = cfg.device.world_size
    if world % k:
        return [
            f"rollout.tensor_parallel_size={k} does not divide the world size {world} "
            f"(device.nnodes * device.devices_per_node): choose a divisor of {world}."
        ]
    if per_node % k:
        return [
            f"rollout.tensor_parallel_size={k} does not divide device.devices_per_node={per_node}: a "
            f"rollout replica spans {k} consecutive ranks of one node (its tensor-parallel traffic stays "
            f"on the node's links); choose a divisor of {per_node}."
        ]
    return []


def inert_settings(cfg: TrainerConfig) -> list[tuple[list[str], str]]:
    """Settings that do nothing in this config because their switch is off, as in verl (`key=value`
    texts, the reason). Not errors: verl's own scripts carry them (`kl_ctrl.kl_coef` beside
    `use_kl_in_reward=False`); the launch lists them once as ignored, from-verl as comments."""
    algorithm, out = cfg.algorithm, []

    def add(changed: list[str], reason: str) -> None:
        if changed:
            out.append((changed, reason))

    if not algorithm.use_kl_in_reward:
        changed = _changed(algorithm, AlgorithmConfig(), ("kl_penalty",), "algorithm")
        changed += _changed(
            algorithm.kl_ctrl, KLControlConfig(), [f.name for f in dataclasses.fields(KLControlConfig)], "algorithm.kl_ctrl"
        )
        add(changed, "read with algorithm.use_kl_in_reward=true only, and it is false")
    elif algorithm.kl_ctrl.type == "fixed":
        add(
            _changed(algorithm.kl_ctrl, KLControlConfig(), ("horizon", "target_kl"), "algorithm.kl_ctrl"),
            "read by the adaptive KL controller only, and algorithm.kl_ctrl.type=fixed",
        )
    groups = algorithm.filter_groups
    if not groups.enable:
        changed = _changed(groups, FilterGroupsConfig(), ("metric", "max_num_gen_batches"), "algorithm.filter_groups")
        if cfg.data.gen_batch_size not in (None, cfg.data.train_batch_size):
            changed.append(f"data.gen_batch_size={cfg.data.gen_batch_size}")
        add(changed, "read by dynamic sampling only, and algorithm.filter_groups.enable=false (every generated "
            "prompt is trained on)")
    correction = algorithm.rollout_correction
    if correction.rollout_is is None:
        add(
            _changed(
                correction,
                RolloutCorrectionConfig(),
                ("rollout_is_threshold", "rollout_is_batch_normalize"),
                "algorithm.rollout_correction",
            ),
            "read with algorithm.rollout_correction.rollout_is=token|sequence only, and it is null",
        )
    if correction.rollout_rs is None and correction.rollout_rs_threshold is not None:
        add(
            [f"algorithm.rollout_correction.rollout_rs_threshold={correction.rollout_rs_threshold!r}"],
            "read with algorithm.rollout_correction.rollout_rs only, and it is null",
        )
    buffer = cfg.reward.overlong_buffer
    if not buffer.enable:
        add(
            _changed(
                buffer,
                OverlongBufferConfig(),
                ("len", "penalty_factor", "log", "max_response_length"),
                "reward.overlong_buffer",
            ),
            "read with reward.overlong_buffer.enable=true only, and it is false",
        )
    if cfg.actor.loss_scale_factor is not None and cfg.actor.loss_agg_mode != "seq-mean-token-sum-norm":
        add(
            [f"actor.loss_scale_factor={cfg.actor.loss_scale_factor}"],
            f"read by loss_agg_mode=seq-mean-token-sum-norm only, and actor.loss_agg_mode={cfg.actor.loss_agg_mode}",
        )
    if cfg.reward.custom_fn and cfg.reward.grader != RewardConfig().grader:
        add(
            [f"reward.grader={cfg.reward.grader!r}"],
            f"read by the built-in rewards only, and reward.custom_fn={cfg.reward.custom_fn} scores every item",
        )
    if cfg.actor.policy_loss.loss_mode != "vanilla":
        add(
            _changed(cfg.actor, ActorConfig(), ("clip_ratio_c",), "actor"),
            f"read by the vanilla PPO loss's dual clip only, and actor.policy_loss.loss_mode="
            f"{cfg.actor.policy_loss.loss_mode} has none",
        )
    if cfg.actor.backend == "megatron":
        add(
            _changed(cfg.actor, ActorConfig(), ("entropy_from_logits_with_chunking",), "actor"),
            "read by the torch backend only (verl's FSDP actor); the Megatron backend computes entropy over "
            "vocabulary-parallel logits, one micro-batch at a time",
        )
    if cfg.logging.val_generations and not (cfg.data.val_files and (cfg.test_freq > 0 or cfg.val_before_train)):
        add(
            [f"logging.val_generations={cfg.logging.val_generations}"],
            "read when validation runs (data.val_files with test_freq > 0 or val_before_train), and it does not",
        )
    if algorithm.adv_estimator == "rloo":
        add(
            _changed(algorithm, AlgorithmConfig(), ("norm_adv_by_std", "adv_eps"), "algorithm"),
            "read by algorithm.adv_estimator=grpo only (RLOO's leave-one-out advantage has no std normalisation)",
        )
    if cfg.data.val_batch_size is not None:
        add(
            [f"data.val_batch_size={cfg.data.val_batch_size}"],
            "grpo generates the whole validation set in one call per rank (verl deprecated this key too)",
        )
    if not cfg.rollout.val_do_sample:
        add(
            _changed(cfg.rollout, RolloutConfig(), ("val_n", "val_temperature", "val_top_p", "val_top_k"), "rollout"),
            "read with rollout.val_do_sample=true only (verl's val_kwargs.do_sample); without it validation is "
            "greedy, one response a prompt",
        )
    if cfg.rollout.engine == "hf":
        add(
            _changed(cfg.rollout, RolloutConfig(), _VLLM_ONLY, "rollout"),
            "read by the vLLM rollout engine only, and rollout.engine=hf (transformers' generate on the policy's "
            "own model)",
        )
    return out


def _no_signal_problems(cfg: TrainerConfig) -> list[str]:
    """Settings under which every group's responses score alike, so nothing is learned: said
    first, since they are the cause of what other checks may find."""
    problems = []
    if cfg.rollout.n < 2:
        problems.append(
            f"rollout.n={cfg.rollout.n} with algorithm.adv_estimator={cfg.algorithm.adv_estimator}: the advantage is a "
            f"response's reward against the other responses to its prompt, so with one response there "
            f"is nothing to compare and nothing is learned. Set rollout.n >= 2 (the recipes use 5 or 6)."
        )
    if cfg.rollout.temperature == 0:
        problems.append(
            f"rollout.temperature=0 samples greedily: the {cfg.rollout.n} responses to a prompt are the same, "
            f"so each group's rewards are equal, every advantage of algorithm.adv_estimator="
            f"{cfg.algorithm.adv_estimator} is 0 and nothing is learned. Set rollout.temperature > 0 (the "
            "recipes use 1.0); validation stays greedy unless rollout.val_do_sample=true."
        )
    return problems


def validate(cfg: TrainerConfig, *, num_experts: int | None = None) -> None:
    """Raise ConfigError listing every cross-field problem of `cfg` (a config resolved by `load`).

    `num_experts`: the model's routed expert count, when known, so `parallel.ep` is checked against it.
    """
    problems = _no_signal_problems(cfg)
    problems += [
        f"{key}={value} must be a positive integer." for key, value in _positive(cfg).items() if value < 1
    ]
    if not problems:
        world = cfg.device.world_size
        # ref.parallel may only repeat parallel (value_problems refuses a different layout).
        problems += _parallel_problems(cfg.parallel, prefix="parallel", world=world, num_experts=num_experts)
        problems += _batch_problems(cfg, world=world)
        problems += _replica_problems(cfg)
    if cfg.device.memory_gib is not None and not cfg.device.memory_gib > 0:
        problems.append(f"device.memory_gib={cfg.device.memory_gib} must be > 0 (GiB of one device), or null to read it")
    problems += value_problems(cfg)
    problems += _recompute_problems(cfg)
    problems += _one_step_off_problems(cfg)
    if problems:
        numbered = " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        plural = "problem" if len(problems) == 1 else "problems"
        raise ConfigError(f"Invalid config, {len(problems)} {plural}: {numbered}")
