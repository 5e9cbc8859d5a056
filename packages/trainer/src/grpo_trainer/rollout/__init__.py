"""Rollout engines: `hf` (transformers generate) and `vllm` (lazy import)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpo_trainer.rollout.hf_engine import HFRolloutEngine

if TYPE_CHECKING:
    from grpo_config.schema import TrainerConfig
    from grpo_trainer.protocols import RolloutEngine

ENGINES = ("hf", "vllm")

__all__ = ["ENGINES", "HFRolloutEngine", "make_rollout_engine"]


def make_rollout_engine(
    cfg: TrainerConfig,
    *,
    device: torch.device,
    tokenizer: Any,
    policy_module: torch.nn.Module | None = None,
    in_training_ranks: bool = False,
) -> RolloutEngine:
    """The `rollout.engine` named in `cfg`. For `hf`, `policy_module` (the trainer's own HF model)
    is shared when given, so weight sync costs nothing; otherwise a copy is loaded from
    `actor.model_path` and kept in sync through `update_weights`. For `vllm` with
    `in_training_ranks`, the engine is this rank's shard of its replica (`grpo_config.replicas`),
    run inside this process: every rank of the replica must build it at the same time. It sleeps
    at level 2 (weights dropped, not copied to host memory): the policy beside it rewrites them all
    at every sync, and `PolicyWorker.rollout_wake` syncs first when no sync has since. An engine of
    its own (a rollout worker, a benchmark) keeps level 1: nothing could restore its weights."""
    name = cfg.rollout.engine
    if name == "hf":
        from grpo_trainer.backends.hf_model import DTYPES, load_causal_lm

        model = (
            policy_module
            if policy_module is not None
            else load_causal_lm(cfg.actor.model_path, device=device, trust_remote_code=cfg.actor.trust_remote_code)
        )
        dtype = DTYPES[cfg.rollout.dtype or cfg.actor.dtype]
        return HFRolloutEngine(
            model=model,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
            autocast_dtype=None if dtype == torch.float32 else dtype,
        )
    if name == "vllm":
        from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

        if in_training_ranks:
            return VLLMRolloutEngine.from_config(
                cfg, cfg.actor.model_path, distributed_executor_backend="external_launcher", sleep_level=2
            )
        return VLLMRolloutEngine.from_config(cfg, cfg.actor.model_path)
    raise ValueError(f"rollout.engine={name!r} is unknown; use one of {list(ENGINES)}")
