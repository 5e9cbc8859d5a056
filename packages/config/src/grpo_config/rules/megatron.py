"""`actor.megatron`'s recompute settings."""

from __future__ import annotations

from grpo_config.schema import (
    TrainerConfig,
)


def recompute_problems(cfg: TrainerConfig) -> list[str]:
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
