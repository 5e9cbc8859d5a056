"""verl-style keys our users' seed scripts use, mapped to grpo_config keys: one line per alias.

A key that starts with an alias followed by "." maps the rest along, so
`actor_rollout_ref.actor.megatron.override_transformer_config.X` -> `actor.megatron.override_transformer_config.X`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import structlog
import yaml

from grpo_config.errors import ConfigError

log = structlog.get_logger()

# MegatronConfig fields that are also megatron-core TransformerConfig fields: an
# override_transformer_config entry of one of these names sets the grpo setting.
TRANSFORMER_SETTINGS = (
    "recompute_method",
    "recompute_granularity",
    "recompute_num_layers",
    "moe_grouped_gemm",
    "moe_permute_fusion",
    "moe_token_dispatcher_type",
    "moe_aux_loss_coeff",
    "moe_z_loss_coeff",
    "moe_router_load_balancing_type",
    "attention_backend",
    "apply_rope_fusion",
    "gradient_accumulation_fusion",
)

_A = "actor_rollout_ref.actor"
_R = "actor_rollout_ref.ref"
_RO = "actor_rollout_ref.rollout"

ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "actor_rollout_ref.model.path": "actor.model_path",
        "data.shuffle_train_dataloader": "data.shuffle",  # verl's name before data.shuffle (Search-R1's scripts)
        "actor_rollout_ref.model.use_remove_padding": "actor.use_remove_padding",
        "actor_rollout_ref.model.enable_gradient_checkpointing": "actor.gradient_checkpointing",
        "actor_rollout_ref.model.trust_remote_code": "actor.trust_remote_code",
        "actor_rollout_ref.nccl_timeout": "timeouts.collective_s",
        f"{_A}.megatron.dtype": "actor.dtype",
        f"{_A}.megatron.use_remove_padding": "actor.use_remove_padding",
        f"{_A}.optim.override_optimizer_config": "actor.megatron.override_optimizer_config",
        f"{_A}.fsdp_config.param_offload": "actor.torch.param_offload",
        f"{_A}.fsdp_config.optimizer_offload": "actor.torch.optimizer_offload",
        f"{_R}.fsdp_config.param_offload": "ref.torch.param_offload",
        f"{_A}.optim.lr": "actor.lr",
        f"{_A}.optim.lr_warmup_steps": "actor.lr_warmup_steps",
        f"{_A}.optim.lr_warmup_steps_ratio": "actor.lr_warmup_steps_ratio",
        f"{_A}.optim.weight_decay": "actor.weight_decay",
        f"{_A}.optim.clip_grad": "actor.grad_clip",
        f"{_A}.optim.override_optimizer_config.optimizer_offload_fraction": "actor.megatron.optimizer_offload_fraction",
        f"{_A}.grad_clip": "actor.grad_clip",
        f"{_A}.ppo_mini_batch_size": "actor.ppo_mini_batch_size",
        f"{_A}.ppo_micro_batch_size_per_gpu": "actor.ppo_micro_batch_size_per_device",
        f"{_A}.ppo_max_token_len_per_gpu": "actor.ppo_max_token_len_per_device",
        f"{_A}.use_dynamic_bsz": "actor.use_dynamic_bsz",
        f"{_A}.ppo_epochs": "actor.ppo_epochs",
        f"{_A}.use_kl_loss": "actor.use_kl_loss",
        f"{_A}.kl_loss_coef": "actor.kl_loss_coef",
        f"{_A}.kl_loss_type": "actor.kl_loss_type",
        f"{_A}.entropy_coeff": "actor.entropy_coeff",
        f"{_A}.entropy_from_logits_with_chunking": "actor.entropy_from_logits_with_chunking",
        f"{_A}.clip_ratio_low": "actor.clip_ratio_low",
        f"{_A}.clip_ratio_high": "actor.clip_ratio_high",
        f"{_A}.clip_ratio_c": "actor.clip_ratio_c",
        f"{_A}.loss_agg_mode": "actor.loss_agg_mode",
        f"{_A}.loss_scale_factor": "actor.loss_scale_factor",
        f"{_A}.policy_loss": "actor.policy_loss",
        f"{_A}.freeze_vision_tower": "actor.freeze_vision_tower",
        f"{_A}.checkpoint.strict": "checkpoint.strict",
        f"{_A}.checkpoint.save_contents": "checkpoint.save_contents",
        f"{_A}.megatron.tensor_model_parallel_size": "parallel.tp",
        f"{_A}.megatron.pipeline_model_parallel_size": "parallel.pp",
        f"{_A}.megatron.expert_model_parallel_size": "parallel.ep",
        f"{_A}.megatron.expert_tensor_parallel_size": "parallel.etp",
        f"{_A}.megatron.context_parallel_size": "parallel.cp",
        f"{_A}.megatron.virtual_pipeline_model_parallel_size": "parallel.vpp",
        f"{_A}.megatron.sequence_parallel": "parallel.sequence_parallel",
        f"{_A}.megatron.param_offload": "actor.megatron.param_offload",
        f"{_A}.megatron.grad_offload": "actor.megatron.grad_offload",
        f"{_A}.megatron.optimizer_offload": "actor.megatron.optimizer_offload",
        f"{_A}.megatron.use_dist_checkpointing": "actor.megatron.use_dist_checkpointing",
        f"{_A}.megatron.use_distributed_optimizer": "actor.megatron.use_distributed_optimizer",
        f"{_A}.megatron.override_transformer_config": "actor.megatron.override_transformer_config",
        f"{_R}.log_prob_micro_batch_size_per_gpu": "ref.log_prob_micro_batch_size_per_device",
        f"{_R}.log_prob_use_dynamic_bsz": "ref.log_prob_use_dynamic_bsz",
        f"{_R}.log_prob_max_token_len_per_gpu": "ref.log_prob_max_token_len_per_device",
        f"{_R}.megatron.dtype": "ref.dtype",
        f"{_R}.megatron.use_remove_padding": "ref.use_remove_padding",
        f"{_R}.megatron.tensor_model_parallel_size": "ref.parallel.tp",
        f"{_R}.megatron.pipeline_model_parallel_size": "ref.parallel.pp",
        f"{_R}.megatron.expert_model_parallel_size": "ref.parallel.ep",
        f"{_R}.megatron.expert_tensor_parallel_size": "ref.parallel.etp",
        f"{_R}.megatron.context_parallel_size": "ref.parallel.cp",
        f"{_R}.megatron.virtual_pipeline_model_parallel_size": "ref.parallel.vpp",
        f"{_R}.megatron.sequence_parallel": "ref.parallel.sequence_parallel",
        f"{_R}.megatron.param_offload": "ref.megatron.param_offload",
        f"{_R}.megatron.use_dist_checkpointing": "ref.megatron.use_dist_checkpointing",
        f"{_R}.megatron.override_transformer_config": "ref.megatron.override_transformer_config",
        f"{_RO}.name": "rollout.engine",
        f"{_RO}.n": "rollout.n",
        f"{_RO}.temperature": "rollout.temperature",
        f"{_RO}.top_p": "rollout.top_p",
        f"{_RO}.top_k": "rollout.top_k",
        f"{_RO}.tensor_model_parallel_size": "rollout.tensor_parallel_size",
        f"{_RO}.gpu_memory_utilization": "rollout.gpu_memory_utilization",
        f"{_RO}.enforce_eager": "rollout.enforce_eager",
        f"{_RO}.free_cache_engine": "rollout.free_cache_engine",
        f"{_RO}.max_model_len": "rollout.max_model_len",
        f"{_RO}.max_num_batched_tokens": "rollout.max_num_batched_tokens",
        f"{_RO}.log_prob_micro_batch_size_per_gpu": "actor.log_prob_micro_batch_size_per_device",
        f"{_RO}.log_prob_use_dynamic_bsz": "actor.log_prob_use_dynamic_bsz",
        f"{_RO}.log_prob_max_token_len_per_gpu": "actor.log_prob_max_token_len_per_device",
        f"{_RO}.dtype": "rollout.dtype",
        f"{_RO}.checkpoint_engine.update_weights_bucket_megabytes": "rollout.weight_sync_bucket_mb",
        f"{_RO}.engine_kwargs.vllm": "rollout.engine_kwargs",
        **{
            f"{_RO}.multi_turn.{name}": f"rollout.multi_turn.{name}"
            for name in (
                "enable",
                "max_assistant_turns",
                "max_user_turns",
                "max_parallel_calls",
                "max_tool_response_length",
                "tool_response_truncate_side",
                "format",
                "tool_config_path",
                "function_tool_path",
            )
        },
        # verl passes these straight to vLLM's engine, as rollout.engine_kwargs does.
        f"{_RO}.enable_chunked_prefill": "rollout.engine_kwargs.enable_chunked_prefill",
        f"{_RO}.enable_prefix_caching": "rollout.engine_kwargs.enable_prefix_caching",
        f"{_RO}.max_num_seqs": "rollout.engine_kwargs.max_num_seqs",
        f"{_RO}.disable_log_stats": "rollout.engine_kwargs.disable_log_stats",
        "trainer.resume_from_path": "checkpoint.resume",
        f"{_RO}.engine_kwargs.vllm.max_model_len": "rollout.max_model_len",
        f"{_RO}.val_kwargs.n": "rollout.val_n",
        f"{_RO}.val_kwargs.temperature": "rollout.val_temperature",
        f"{_RO}.val_kwargs.top_p": "rollout.val_top_p",
        f"{_RO}.val_kwargs.top_k": "rollout.val_top_k",
        f"{_RO}.val_kwargs.do_sample": "rollout.val_do_sample",
        "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std",
        "reward_model.overlong_buffer": "reward.overlong_buffer",
        "reward_model.reward_kwargs.overlong_buffer_cfg": "reward.overlong_buffer",
        "reward_model.reward_kwargs.max_resp_len": "reward.overlong_buffer.max_response_length",
        # verl's newer layout of the same settings under `reward.` (its reward_model section split up).
        "reward.reward_kwargs.overlong_buffer_cfg": "reward.overlong_buffer",
        "reward.reward_kwargs.max_resp_len": "reward.overlong_buffer.max_response_length",
        "custom_reward_function.path": "reward.custom_fn",
        "custom_reward_function.name": "reward.custom_fn_name",
        "reward.custom_reward_function.path": "reward.custom_fn",
        "reward.custom_reward_function.name": "reward.custom_fn_name",
        # verl's one_step_off_policy recipe: the rollout workers' own devices.
        "rollout.n_gpus_per_node": "rollout.devices_per_node",
        "trainer.nnodes": "device.nnodes",
        "trainer.n_gpus_per_node": "device.devices_per_node",
        "trainer.device": "device.kind",
        "trainer.save_freq": "checkpoint.save_freq",
        "trainer.default_local_dir": "checkpoint.dir",
        "trainer.max_actor_ckpt_to_keep": "checkpoint.max_to_keep",
        "trainer.test_freq": "test_freq",
        "trainer.total_epochs": "total_epochs",
        "trainer.total_training_steps": "total_training_steps",
        "trainer.val_before_train": "val_before_train",
        "trainer.balance_batch": "actor.balance_batch",
        "trainer.max_zero_advantage_steps": "max_zero_advantage_steps",
        "trainer.project_name": "project_name",
        "trainer.log_val_generations": "logging.val_generations",
        "trainer.experiment_name": "experiment_name",
        "actor.checkpoint.strict": "checkpoint.strict",
        # Transformer-config keys grpo has as settings of their own (the rest stay overrides).
        **{
            f"{verl}.megatron.override_transformer_config.{name}": f"{ours}.megatron.{name}"
            for verl, ours in ((_A, "actor"), (_R, "ref"))
            for name in TRANSFORMER_SETTINGS
        },
    }
)

# Keys choosing between mbridge and Megatron-Bridge: we always use Megatron-Bridge, so only the value
# that says so is accepted (and dropped, with a deprecation warning).
_BRIDGE_KEYS: Mapping[str, tuple[bool, ...]] = MappingProxyType(
    {
        # True: verl converts with the mbridge package; grpo with Megatron-Bridge, the same model.
        f"{_A}.megatron.vanilla_mbridge": (False, True),
        f"{_A}.megatron.use_mbridge": (True,),
        f"{_R}.megatron.vanilla_mbridge": (False, True),
        f"{_R}.megatron.use_mbridge": (True,),
    }
)

_NO_COMPILE = (
    "speed only: verl compiles its FSDP engine's log-prob / entropy functions with it (its Megatron engine "
    "does not read it); grpo does not compile them, and the results are the same"
)
_BOTH = (True, False)
ANY_VALUE = object()  # a _FIXED_KEYS entry accepting every value: the key changes nothing but speed

_FSDP_DEFAULT = (
    "how FSDP shards: grpo's torch backend stands in for verl's FSDP with DDP (whole parameters on every device, "
    "the same update), so only verl's default, which asks for nothing more, is taken"
)
_CONSTANT_LR = "grpo's learning rate is constant after actor.lr_warmup_steps, as verl's 'constant'"
_REWARD_MANAGER = (
    "grpo's reward manager scores each response as verl's naive one and adds the overlong penalty of "
    "verl's dapo one when reward.overlong_buffer.enable (verl's overlong_buffer_cfg) is set"
)
_MULTI_TURN = f"{_RO}.multi_turn."
_NO_MULTI_TURN = (
    "grpo's multi-turn rollouts call tools (rollout.multi_turn: built-in calculator and python, "
    "function_tool_path; docs/MULTI_TURN.md); a project's agent loops, search servers and simulated users are "
    "not in grpo"
)
_NO_ULYSSES = (
    "grpo's torch backend runs no Ulysses sequence parallelism (verl's default, 1); sequence parallelism "
    "is the Megatron backend's (parallel.cp, parallel.sequence_parallel)"
)

_NO_ROW_CAP = (
    "a cap on the rows read from the data files (Search-R1's verl fork; null, no cap, is its default): grpo "
    "reads every row of data.train_files / data.val_files"
)
_GAE_ONLY = (
    "GAE's discount / trace factor: verl reads it only in its gae and reinforce_plus_plus estimators (refused "
    "here through algorithm.adv_estimator); its grpo and rloo, as grpo's, do not"
)
_DROPOUTS = ("attention_dropout", "embd_pdrop", "resid_pdrop")
_NO_DROPOUT = (
    "a dropout rate written into the model's config: grpo trains with the checkpoint's config as it is, and "
    "the Qwen checkpoints verl's scripts train have no dropout (attention_dropout 0.0; embd_pdrop and "
    "resid_pdrop are not read by them), so only 0 restates it"
)

# verl's deprecated global micro-batch sizes: verl divides each by the world size into its `_per_gpu` key.
GLOBAL_MICRO_BATCH_KEYS = (f"{_A}.ppo_micro_batch_size", f"{_RO}.log_prob_micro_batch_size", f"{_R}.log_prob_micro_batch_size")

# verl keys with no grpo setting: the values that describe what grpo does, or that change only speed,
# are accepted (dropped, and listed as inert with the reason); any other is refused with the reason.
_FIXED_KEYS: Mapping[str, tuple[Any, str]] = MappingProxyType(
    {
        "trainer.critic_warmup": ((0,), "GRPO has no critic, so there is no critic warm-up"),
        f"{_MULTI_TURN}interaction_config_path": (
            (None,),
            "verl's interactions (a simulated user answering each turn) are not in grpo; its multi-turn "
            "rollouts answer tool calls only",
        ),
        f"{_MULTI_TURN}use_inference_chat_template": (
            (False,),
            "grpo trains on the ids as sampled, earlier turns' reasoning included (verl's default, false)",
        ),
        f"{_MULTI_TURN}tokenization_sanity_check_mode": (
            ANY_VALUE,
            "grpo never decodes and encodes a turn again (the ids trained on are the ids sampled plus the "
            "template's tool messages), so there is no re-tokenisation to check",
        ),
        f"{_MULTI_TURN}num_repeat_rollouts": ((None,), "grpo samples rollout.n responses a prompt (verl's default, null)"),
        f"{_A}.ulysses_sequence_parallel_size": ((1,), _NO_ULYSSES),
        f"{_R}.ulysses_sequence_parallel_size": ((1,), _NO_ULYSSES),
        f"{_A}.fsdp_config.ulysses_sequence_parallel_size": ((1,), _NO_ULYSSES),
        f"{_R}.fsdp_config.ulysses_sequence_parallel_size": ((1,), _NO_ULYSSES),
        "trainer.default_hdfs_dir": (
            (None,),
            "grpo copies no checkpoint to HDFS (verl's default, null): checkpoints stay under checkpoint.dir",
        ),
        f"{_RO}.data_parallel_size": (
            (1,),
            "vLLM's own data parallelism is off in grpo's engines (verl's default, 1): each training rank's "
            "engine takes that rank's prompts",
        ),
        f"{_RO}.expert_parallel_size": (
            (1,),
            "vLLM's expert parallelism is off in grpo's engines (verl's default, 1): experts are split as "
            "rollout.tensor_parallel_size splits them",
        ),
        f"{_A}.use_torch_compile": (_BOTH, _NO_COMPILE),
        f"{_R}.use_torch_compile": (_BOTH, _NO_COMPILE),
        f"{_A}.fsdp_config.forward_prefetch": (_BOTH, "speed only: FSDP's prefetch of the next layer's shards"),
        f"{_R}.fsdp_config.forward_prefetch": (_BOTH, "speed only: FSDP's prefetch of the next layer's shards"),
        "data.filter_overlong_prompts_workers": (
            ANY_VALUE,
            "speed only: grpo tokenises and filters prompts in the driver in one pass (seconds for geo3k); "
            "data.filter_overlong_prompts is honoured",
        ),
        "ray_kwargs.ray_init.runtime_env.py_executable": (
            ANY_VALUE,
            "grpo's Ray workers run the driver's own Python (launch grpo inside the environment they need, "
            "e.g. under `uv run`, as verl's script does for its driver)",
        ),
        "actor_rollout_ref.model.use_fused_kernels": (
            (False,),
            "grpo computes log-probs and entropy from the logits as verl does without its fused kernels",
        ),
        f"{_A}.optim.lr_decay_style": (
            ("constant",),
            _CONSTANT_LR,
        ),
        f"{_A}.optim.lr_scheduler_type": (
            ("constant",),
            _CONSTANT_LR,
        ),
        f"{_A}.optim.warmup_style": (
            ("constant",),
            f"verl's former name of lr_scheduler_type: {_CONSTANT_LR}",
        ),
        "trainer.val_only": (
            (False,),
            "grpo trains as verl does with val_only=false (its default); a run that only validates is not in grpo",
        ),
        f"{_RO}.ignore_eos": (
            (False,),
            "grpo's engines stop a response at the end-of-sequence token, as verl's default (false)",
        ),
        f"{_RO}.load_format": (
            ("auto", "safetensors"),
            "grpo's engine loads the checkpoint's safetensors (vLLM's auto), then takes the actor's weights at "
            "every weight sync",
        ),
        "trainer.use_legacy_worker_impl": (
            ANY_VALUE,
            "it picks between verl's two implementations of its workers; grpo's workers are its own, and the "
            "run's settings are read the same whichever verl would pick",
        ),
        f"{_R}.strategy": (
            ("fsdp", "fsdp2", "megatron"),
            "grpo builds the reference model with the actor's backend (actor_rollout_ref.actor.strategy), as "
            "verl uses one engine for both",
        ),
        **{
            key: ((None,), f"verl's deprecated global micro-batch size (null, its default, sets nothing): grpo takes "
                  f"the per-device size, {key}_per_gpu; from-verl divides a global one by the call's world size, "
                  "as verl does")
            for key in GLOBAL_MICRO_BATCH_KEYS
        },
        **{
            f"{section}.fsdp_config.{name}": ((default,), _FSDP_DEFAULT)
            for section in (_A, _R)
            for name, default in (("fsdp_size", -1), ("reshard_after_forward", True), ("offload_policy", False))
        },
        f"{_A}.fsdp_config.grad_offload": (
            _BOTH,
            "grpo's torch backend frees the gradients after each optimizer step, so none are held outside the "
            "update to offload (verl's FSDP engine has since dropped the key)",
        ),
        f"{_RO}.calculate_log_probs": (
            (True,),
            "grpo always collects the rollout engine's sampling log-probs and logs their gap to the "
            "actor's as rollout/logprob_abs_diff every step (in bypass mode they are the old log-probs); "
            "it cannot be switched off",
        ),
        f"{_RO}.mode": (
            ("sync", "async"),
            "verl's sync and async (server) rollout modes generate the same samples for single-turn prompts; "
            "grpo's engine takes each rank's prompts in one call (rollout.mode chooses colocated or one-step-off)",
        ),
        "data.return_raw_chat": (
            (True, False),
            "grpo applies the chat template once in the driver (data.apply_chat_template) and hands the engine "
            "token ids, so no raw chat is passed on",
        ),
        f"{_R}.entropy_from_logits_with_chunking": (
            (True, False),
            "the reference model's pass computes no entropy",
        ),
        "reward_model.reward_manager": (("naive", "dapo"), _REWARD_MANAGER),
        "reward.reward_manager.name": (("naive", "dapo"), _REWARD_MANAGER),
        "data.train_data_num": ((None,), _NO_ROW_CAP),
        "data.val_data_num": ((None,), _NO_ROW_CAP),
        "algorithm.gamma": (ANY_VALUE, _GAE_ONLY),
        "algorithm.lam": (ANY_VALUE, _GAE_ONLY),
        **{f"actor_rollout_ref.model.override_config.{name}": ((0.0, 0), _NO_DROPOUT) for name in _DROPOUTS},
    }
)

# verl keys refused whatever their value, with the reason.
_REFUSED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        f"{_A}.tis_imp_ratio_cap": (
            "verl's legacy token-level TIS key; set algorithm.rollout_correction.rollout_is=token and "
            "algorithm.rollout_correction.rollout_is_threshold=<the cap> (verl's current keys)"
        ),
    }
)

_NO_FSDP = (
    "verl's FSDP engine setting: grpo's torch backend trains with DDP (whole parameters on every device), so "
    "FSDP's sharding and precision settings have nothing to act on (its param_offload / optimizer_offload are "
    "actor.torch's); large models train on the Megatron backend (model_engine=megatron)"
)
_NO_PROFILER = (
    "verl's step profiler (nsys, torch or NPU profiler per step): grpo has no profiler setting; every step's "
    "per-phase seconds are in its metrics, and bench/ profiles phases on the GPU machine (docs/benchmarks.md)"
)
# verl sections grpo has no counterpart for: every key under one is refused with the section's reason
# (checked after the keys above, so an inert value of one of them still passes).
_REFUSED_SECTIONS: Mapping[str, str] = MappingProxyType(
    {
        "critic.": (
            "verl's critic (a value model, PPO with algorithm.adv_estimator=gae): GRPO trains no critic; grpo's "
            "estimators are grpo and rloo, which need none"
        ),
        "distillation.": "verl's on-policy distillation (a teacher's log-probs in the loss) is not in grpo",
        "retriever.": f"a search server for tool calls: {_NO_MULTI_TURN}",
        "actor_rollout_ref.agent.": f"a project's agent loop settings: {_NO_MULTI_TURN}",
        f"{_A}.fsdp_config.": _NO_FSDP,
        f"{_R}.fsdp_config.": _NO_FSDP,
        f"{_A}.veomni.": "verl's VeOmni engine setting: grpo trains with its Megatron or torch backend",
        "global_profiler.": _NO_PROFILER,
        f"{_A}.profiler.": _NO_PROFILER,
        f"{_R}.profiler.": _NO_PROFILER,
        f"{_RO}.profiler.": _NO_PROFILER,
        "actor_rollout_ref.model.mtp.": "multi-token prediction (MTP) layers are not trained or used by grpo",
        "hydra.": (
            "Hydra's own settings (its output folder, logging): grpo does not run under Hydra; its folders are "
            "logging.dir and checkpoint.dir"
        ),
    }
)

# trainer.logger entries -> the grpo logging switch each turns on.
_LOGGERS: Mapping[str, str] = MappingProxyType(
    {"console": "logging.console", "tensorboard": "logging.tensorboard", "wandb": "logging.wandb"}
)

# Roots that exist only as verl aliases: any key under them that is not an alias is unknown.
ALIAS_ONLY_ROOTS = frozenset({"actor_rollout_ref", "trainer", "reward_model"})


def _as_python(value: Any) -> Any:
    """A verl override's text as YAML (Hydra's values are YAML); other values as they are."""
    if isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def _logger_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    loggers = _as_python(value)
    if isinstance(loggers, str):
        loggers = [loggers]
    if not isinstance(loggers, list) or not all(isinstance(x, str) for x in loggers):
        raise ConfigError(f"'{key}' must be a list of logger names, e.g. ['console'], got {value!r}.", key=key)
    unknown = [name for name in loggers if name not in _LOGGERS]
    if unknown:
        raise ConfigError(
            f"'{key}={value}' asks for {', '.join(repr(n) for n in unknown)}, which grpo does not log to. "
            f"grpo logs every step to the console, <logging.dir>/<project_name>/<experiment_name>/"
            f"metrics.jsonl, TensorBoard, Weights & Biases and metrics.png (logging.console / jsonl / "
            f"tensorboard / wandb / plot). Keep only {', '.join(repr(n) for n in _LOGGERS)} in {key}.",
            key=key,
        )
    return [(setting, name in loggers) for name, setting in _LOGGERS.items()]


def _fixed_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    accepted, why = _FIXED_KEYS[key]
    given = _as_python(value)
    if accepted is not ANY_VALUE and not any(given == a and type(given) is type(a) for a in accepted):
        allowed = " or ".join(repr(a) for a in accepted)
        raise ConfigError(f"'{key}={value}' cannot be honoured: {why} (only {allowed} is accepted).", key=key)
    log.info("config.verl_key_ignored", key=key, value=given, reason=why)
    return []


def ignored_reason(key: str) -> str | None:
    """Why a verl key that sets nothing in grpo (its value restates what grpo does) is dropped; None
    for a key that sets something."""
    if key in _FIXED_KEYS:
        return _FIXED_KEYS[key][1]
    if key in _BRIDGE_KEYS:
        return "grpo always converts models through Megatron-Bridge"
    return None


def _refused_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    raise ConfigError(f"'{key}={value}' is not used by grpo: {_REFUSED_KEYS[key]}.", key=key)


HYBRID_ENGINE_KEY = "actor_rollout_ref.hybrid_engine"


def _hybrid_engine_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    """verl's hybrid engine (true, its default) is grpo's rollout.mode=sync; verl's one-step-off
    recipe sets it false for rollout workers of their own: rollout.mode=one_step_off."""
    flag = _as_python(value)
    if not isinstance(flag, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}.", key=key)
    return [] if flag else [("rollout.mode", "one_step_off")]


STRATEGY_KEY = f"{_A}.strategy"
# verl's training engines -> grpo's backends.
_STRATEGIES: Mapping[str, str] = MappingProxyType({"megatron": "megatron", "fsdp": "torch", "fsdp2": "torch"})


def _strategy_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    """verl's actor strategy -> actor.backend. FSDP, of either generation, is grpo's torch backend:
    the same update, with whole parameters on every device (DDP) instead of FSDP's shards, so the
    model must fit one device."""
    strategy = _as_python(value)
    if not isinstance(strategy, str) or strategy not in _STRATEGIES:
        raise ConfigError(
            f"'{key}={value}': verl's {strategy!r} engine has no counterpart in grpo; its backends are megatron "
            f"(verl's megatron) and torch (verl's fsdp / fsdp2, trained with DDP).",
            key=key,
        )
    if _STRATEGIES[strategy] == "torch":
        log.info("config.verl_fsdp_as_ddp", key=key, value=strategy,
                 note="grpo's torch backend keeps whole parameters on every device (DDP), not FSDP's shards")
    return [("actor.backend", _STRATEGIES[strategy])]


MODEL_ENGINE_KEY = "model_engine"


def _model_engine_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    """verl's `model_engine=megatron` (its Megatron trainer config) is grpo's Megatron backend."""
    engine = _as_python(value)
    if engine != "megatron":
        raise ConfigError(
            f"'{key}={value}': grpo trains Qwen3.5 with its Megatron backend (model_engine=megatron) or, on the "
            f"CPU, its plain-torch one (actor.backend=torch); verl's {engine!r} engine has no counterpart here.",
            key=key,
        )
    return [("actor.backend", "megatron")]


# verl's trainer.resume_mode -> checkpoint.resume ("resume_path": trainer.resume_from_path names it).
_RESUME_MODES: Mapping[str, str] = MappingProxyType({"auto": "auto", "disable": "none"})


def _resume_settings(key: str, value: Any) -> list[tuple[str, Any]]:
    mode = _as_python(value)
    if isinstance(mode, str) and mode in _RESUME_MODES:
        return [("checkpoint.resume", _RESUME_MODES[mode])]
    if mode == "resume_path":
        return []
    raise ConfigError(
        f"'{key}={value}': verl's resume modes are auto, disable and resume_path (with trainer.resume_from_path).",
        key=key,
    )


def special_settings(key: str, value: Any) -> list[tuple[str, Any]] | None:
    """For a verl key with no one-to-one grpo setting: the (grpo key, value) pairs it sets (maybe
    none), or ConfigError with the reason it is refused. None when `key` is not such a key."""
    if key == "trainer.logger":
        return _logger_settings(key, value)
    if key == HYBRID_ENGINE_KEY:
        return _hybrid_engine_settings(key, value)
    if key == "trainer.resume_mode":
        return _resume_settings(key, value)
    if key == MODEL_ENGINE_KEY:
        return _model_engine_settings(key, value)
    if key == STRATEGY_KEY:
        return _strategy_settings(key, value)
    if key in _FIXED_KEYS:
        return _fixed_settings(key, value)
    if key in _REFUSED_KEYS:
        return _refused_settings(key, value)
    if key.startswith(_MULTI_TURN) and key not in ALIASES:
        raise ConfigError(
            f"'{key}={value}' is not a multi_turn key grpo knows: it maps "
            f"{', '.join(sorted(k.removeprefix(_MULTI_TURN) for k in ALIASES if k.startswith(_MULTI_TURN)))}.",
            key=key,
        )
    section = next((prefix for prefix in _REFUSED_SECTIONS if key.startswith(prefix)), None)
    if section is not None and key not in ALIASES:
        raise ConfigError(f"'{key}={value}' cannot be honoured: {_REFUSED_SECTIONS[section]}.", key=key)
    return None


def is_bridge_key(key: str) -> bool:
    return key in _BRIDGE_KEYS


def check_bridge_key(key: str, value: bool) -> None:
    """Accept a bridge choice grpo can stand in for, with a warning: Megatron-Bridge builds the same
    Megatron model from the same HF weights as mbridge (`vanilla_mbridge=True`). Refuse verl's
    bridge-less path (`use_mbridge=False`: Megatron checkpoints converted offline)."""
    if value not in _BRIDGE_KEYS[key]:
        raise ConfigError(
            f"'{key}={value}' asks verl to load Megatron checkpoints converted offline, without a bridge; grpo "
            f"always converts the HF checkpoint through Megatron-Bridge (actor.megatron.bridge='megatron-bridge'). "
            f"Remove the key or set it to True.",
            key=key,
        )
    note = "grpo always converts through Megatron-Bridge; this key has no effect, remove it"
    if value and key.endswith("vanilla_mbridge"):
        note = "grpo converts through Megatron-Bridge, not mbridge: the same Megatron model from the same HF weights"
    log.warning("config.deprecated_key", key=key, value=value, note=note)


def resolve_alias(key: str) -> str | None:
    """The grpo_config key for a verl-style `key`, or None when `key` is not an alias."""
    if key in ALIASES:
        return ALIASES[key]
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        target = ALIASES.get(".".join(parts[:cut]))
        if target is not None:
            return ".".join([target, *parts[cut:]])
    return None


def all_alias_keys() -> list[str]:
    return [*ALIASES, *_BRIDGE_KEYS, *_FIXED_KEYS, *_REFUSED_KEYS, "trainer.logger", "trainer.resume_mode", HYBRID_ENGINE_KEY, MODEL_ENGINE_KEY, STRATEGY_KEY]
