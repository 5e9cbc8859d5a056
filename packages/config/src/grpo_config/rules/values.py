"""Values one by one: ranges, values not supported yet, override dicts that would set what a grpo
setting sets, settings the chosen backend or engine never reads."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from grpo_config.aliases import TRANSFORMER_SETTINGS
from grpo_config.rules.algorithm import algorithm_problems
from grpo_config.rules.common import changed_fields, not_finite, setting_at
from grpo_config.rules.layout import megatron_reference_problems
from grpo_config.schema import (
    MegatronConfig,
    ParallelConfig,
    RefMegatronConfig,
    TimeoutsConfig,
    TrainerConfig,
)

TIMEOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TimeoutsConfig)}


FOLDER_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")


# (dotted key, test of the value, what the value must be): each checked on the resolved config.
RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
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
    (
        "actor.clip_ratio_c",
        lambda v: v > 1,
        "greater than 1 (dual-clip lower bound of the PPO loss), e.g. 3.0",
    ),
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
    (
        "reward.overlong_buffer.max_response_length",
        lambda v: v is None or v >= 1,
        ">= 1 tokens or null (the budget)",
    ),
    ("logging.val_generations", lambda v: v >= 0, ">= 0 samples (0: none)"),
    ("reward.timeout_s", lambda v: v > 0, "> 0 seconds"),
    ("reward.num_workers", lambda v: v >= 1, ">= 1"),
    ("checkpoint.save_freq", lambda v: v == -1 or v >= 1, "-1 (only at the end) or >= 1 steps"),
    ("checkpoint.max_to_keep", lambda v: v is None or v >= 1, ">= 1 or null (keep all)"),
    ("test_freq", lambda v: v == -1 or v >= 1, "-1 (never) or >= 1 steps"),
    ("total_epochs", lambda v: v >= 1, ">= 1"),
    ("total_training_steps", lambda v: v is None or v >= 1, ">= 1 or null (total_epochs decides)"),
    (
        "timeouts.collective_s",
        lambda v: v is None or 0 < v < math.inf,
        "a positive, finite number of seconds or null",
    ),
)


# (dotted key, a value we cannot honour yet, why, what to do instead).
NOT_YET: tuple[tuple[str, Any, str], ...] = (
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


# megatron-core OptimizerConfig fields that grpo sets from its own settings.
OPTIMIZER_SETTINGS: dict[str, str] = {
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
ENGINE_SETTINGS: dict[str, str] = {
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


def override_problems(cfg: TrainerConfig) -> list[str]:
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
        if (ours := ENGINE_SETTINGS.get(name))
    ]
    if cfg.actor.backend == "megatron" and cfg.ref.dtype not in (None, cfg.actor.dtype):
        problems.append(
            f"ref.dtype={cfg.ref.dtype} differs from actor.dtype={cfg.actor.dtype}: the Megatron "
            f"backend builds the reference model in actor.dtype. Unset ref.dtype."
        )
    problems += [
        f"actor.megatron.override_optimizer_config.{name} is set by grpo from {ours}: set {ours} instead."
        for name in cfg.actor.megatron.override_optimizer_config
        if (ours := OPTIMIZER_SETTINGS.get(name))
    ]
    return problems


# Settings read by one backend / rollout engine only: set to anything but the default with the
# other, they would be accepted and ignored.
VLLM_ONLY = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "max_model_len",
    "max_num_batched_tokens",
    "free_cache_engine",
    "weight_sync_bucket_mb",
)


def unread_problems(cfg: TrainerConfig) -> list[str]:
    problems: list[str] = []
    if cfg.actor.backend == "torch":
        changed = changed_fields(
            cfg.parallel, ParallelConfig(), [f.name for f in dataclasses.fields(ParallelConfig)], "parallel"
        )
        changed += changed_fields(
            cfg.actor.megatron,
            MegatronConfig(),
            [f.name for f in dataclasses.fields(MegatronConfig)],
            "actor.megatron",
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
        problems += megatron_reference_problems(cfg)
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


def value_problems(cfg: TrainerConfig) -> list[str]:
    """Problems of single values (ranges, values grpo cannot honour, overrides of grpo settings)."""
    problems: list[str] = []
    for key, ok, expected in RANGES:
        value = setting_at(cfg, key)
        if not_finite(value) or not ok(value):
            problems.append(f"{key}={value} is out of range: it must be {expected}.")
    for key, refused, why in NOT_YET:
        inherited = key.startswith("ref.") and setting_at(cfg, "actor." + key[4:]) == refused
        if setting_at(cfg, key) == refused and not inherited:
            problems.append(f"{key}={refused} cannot be honoured: {why}.")
    problems += override_problems(cfg)
    problems += unread_problems(cfg)
    problems += algorithm_problems(cfg)
    problems += [
        f"{key}={name!r} names a folder (<logging.dir>/<project_name>/<experiment_name>): use letters, "
        f"digits, '.', '_' or '-', not starting with '.'."
        for key, name in (("project_name", cfg.project_name), ("experiment_name", cfg.experiment_name))
        if not FOLDER_NAME.fullmatch(name)
    ]
    if cfg.max_zero_advantage_steps < 0:
        problems.append(
            f"max_zero_advantage_steps={cfg.max_zero_advantage_steps} must be >= 0 (0: never stop for "
            "steps whose advantages are all zero)."
        )
    for name, default in TIMEOUT_DEFAULTS.items():
        seconds = getattr(cfg.timeouts, name)
        if default is not None and not 0.0 < seconds < math.inf:
            problems.append(
                f"timeouts.{name}={seconds} must be a positive, finite number of seconds (how long the "
                f"driver waits for every rank in that phase before it stops the run): set "
                f"timeouts.{name} to e.g. {default:g}."
            )
    return problems
