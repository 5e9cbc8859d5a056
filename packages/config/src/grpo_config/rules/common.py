"""Helpers the rule modules share: a setting by its dotted key, the fields of a section that differ."""

from __future__ import annotations

import math
from typing import Any

from grpo_config.schema import (
    TrainerConfig,
)


def value_of(cfg: TrainerConfig, key: str) -> int:
    section, name = key.split(".", 1)
    return getattr(getattr(cfg, section), name)


def setting_at(cfg: TrainerConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def changed_fields(section: Any, default: Any, names: Any, prefix: str) -> list[str]:
    return [
        f"{prefix}.{name}={getattr(section, name)!r}"
        for name in names
        if getattr(section, name) != getattr(default, name)
    ]


LOG_PROB_SETTINGS = (
    "log_prob_micro_batch_size_per_device",
    "log_prob_use_dynamic_bsz",
    "log_prob_max_token_len_per_device",
)
