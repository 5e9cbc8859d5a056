"""The Megatron settings (`parallel`, `actor.megatron`, `ref.megatron`): ranges, what grpo sets
itself, the recompute settings, and all of them refused with `actor.backend=torch`."""

from __future__ import annotations

import dataclasses

from grpo_config.aliases import TRANSFORMER_SETTINGS
from grpo_config.rules.common import NotYet, Range, changed_fields, not_yet_problems, range_problems
from grpo_config.rules.layout import megatron_reference_problems
from grpo_config.schema import (
    MegatronConfig,
    ParallelConfig,
    RefMegatronConfig,
    TrainerConfig,
)

RANGES: tuple[Range, ...] = (
    ("actor.megatron.optimizer_offload_fraction", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("actor.megatron.moe_aux_loss_coeff", lambda v: v >= 0, ">= 0"),
    ("actor.megatron.moe_z_loss_coeff", lambda v: v >= 0, ">= 0"),
)

NOT_YET: tuple[NotYet, ...] = (
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


def megatron_problems(cfg: TrainerConfig) -> list[str]:
    problems = range_problems(cfg, RANGES) + not_yet_problems(cfg, NOT_YET) + override_problems(cfg)
    if cfg.actor.backend == "torch":
        problems += unread_with_torch(cfg)
    if cfg.actor.backend == "megatron":
        problems += megatron_reference_problems(cfg)
    return problems + recompute_problems(cfg)


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
    problems += [
        f"actor.megatron.override_optimizer_config.{name} is set by grpo from {ours}: set {ours} instead."
        for name in cfg.actor.megatron.override_optimizer_config
        if (ours := OPTIMIZER_SETTINGS.get(name))
    ]
    return problems


def unread_with_torch(cfg: TrainerConfig) -> list[str]:
    """Megatron settings changed while `actor.backend=torch`: accepted and ignored otherwise."""
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
    if not changed:
        return []
    return [
        f"{', '.join(changed)}: read by the Megatron backend only, and actor.backend=torch (data "
        f"parallel over every device, no model parallelism). Remove them or set actor.backend=megatron."
    ]


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
