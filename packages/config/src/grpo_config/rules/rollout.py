"""The `rollout` section: ranges, the engine's own arguments, settings only vLLM reads, and
`rollout.mode=one_step_off` (rollout workers of their own, and what they need)."""

from __future__ import annotations

from grpo_config.rules.common import Range, range_problems
from grpo_config.schema import (
    TrainerConfig,
)

RANGES: tuple[Range, ...] = (
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
    ("rollout.multi_turn.max_assistant_turns", lambda v: v is None or v >= 0, ">= 1, or 0 / null (no limit, as verl)"),
    ("rollout.multi_turn.max_user_turns", lambda v: v is None or v >= 0, ">= 1, or 0 / null (no limit, as verl)"),
    ("rollout.multi_turn.max_parallel_calls", lambda v: v >= 1, ">= 1"),
    ("rollout.multi_turn.max_tool_response_length", lambda v: v >= 1, ">= 1 character"),
    ("rollout.multi_turn.tool_timeout_s", lambda v: v > 0, "> 0 seconds"),
    ("rollout.multi_turn.tool_memory_mb", lambda v: v >= 64, ">= 64 MB (a Python interpreter needs about 30)"),
)

# The tools grpo_trainer.tools.registry builds in (a trainer test checks the two agree).
BUILTIN_TOOLS = ("calculator", "python")

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

# Settings read by the vLLM engine only: set to anything but the default with the hf engine, they
# would be accepted and ignored (listed as inert, rules/inert.py).
VLLM_ONLY = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "max_model_len",
    "max_num_batched_tokens",
    "free_cache_engine",
    "weight_sync_bucket_mb",
)


def rollout_problems(cfg: TrainerConfig) -> list[str]:
    return (
        range_problems(cfg, RANGES)
        + engine_kwargs_problems(cfg)
        + one_step_off_problems(cfg)
        + multi_turn_problems(cfg)
    )


def multi_turn_problems(cfg: TrainerConfig) -> list[str]:
    """The tools named exist (a tensor-parallel replica is fine: the driver runs the tools once and
    every rank of the replica reads the same answers)."""
    turns = cfg.rollout.multi_turn
    if not turns.enable:
        return []
    problems = [
        f"rollout.multi_turn.tools has {name!r}, which is not a built-in tool; the built-in tools are "
        f"{', '.join(BUILTIN_TOOLS)} (your own: rollout.multi_turn.function_tool_path)."
        for name in turns.tools
        if name not in BUILTIN_TOOLS
    ]
    if not cfg.data.apply_chat_template:
        problems.append(
            "rollout.multi_turn.enable=true with data.apply_chat_template=false: the tools are listed to the model "
            "and their answers rendered by the chat template. Set data.apply_chat_template=true."
        )
    if not turns.tools and not turns.function_tool_path and not turns.tool_config_path:
        problems.append(
            "rollout.multi_turn.enable=true with no tools: set rollout.multi_turn.tools (calculator, python), "
            "rollout.multi_turn.function_tool_path or rollout.multi_turn.tool_config_path."
        )
    return problems


def engine_kwargs_problems(cfg: TrainerConfig) -> list[str]:
    """`rollout.engine_kwargs` are vllm.LLM's own arguments, never one grpo sets itself."""
    problems: list[str] = []
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
    return problems


def one_step_off_problems(cfg: TrainerConfig) -> list[str]:
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
    section = cfg.actor.megatron if cfg.actor.backend == "megatron" else cfg.actor.torch
    offloads = [
        f"actor.{cfg.actor.backend}.{name}=true"
        for name in ("param_offload", "grad_offload", "optimizer_offload")
        if getattr(section, name, False)
    ]
    if offloads:
        problems.append(
            f"{', '.join(offloads)}: offload frees the training devices for a colocated rollout engine; "
            "with rollout.mode=one_step_off the engine has devices of its own, so nothing would use the "
            "freed memory. Set them to false"
            + (" (actor.megatron.optimizer_offload_fraction still offloads the optimizer step itself)."
               if cfg.actor.backend == "megatron" else ".")
        )
    return problems
