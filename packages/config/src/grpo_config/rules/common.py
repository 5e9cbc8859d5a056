"""Helpers the rule modules share: a setting by its dotted key, the fields of a section that differ,
the range and not-yet tables each section keeps."""

from __future__ import annotations

import math
from collections.abc import Callable
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


# A range: (dotted key, test of the value, what the value must be), checked on the resolved config.
Range = tuple[str, Callable[[Any], bool], str]
# A value grpo cannot honour yet: (dotted key, the value, why and what to do instead).
NotYet = tuple[str, Any, str]


def range_problems(cfg: TrainerConfig, ranges: tuple[Range, ...]) -> list[str]:
    problems = []
    for key, ok, expected in ranges:
        value = setting_at(cfg, key)
        if not_finite(value) or not ok(value):
            problems.append(f"{key}={value} is out of range: it must be {expected}.")
    return problems


def not_yet_problems(cfg: TrainerConfig, refused: tuple[NotYet, ...]) -> list[str]:
    """A `ref.` key that holds the refused value because the actor's does is named once, there."""
    problems = []
    for key, value, why in refused:
        inherited = key.startswith("ref.") and setting_at(cfg, "actor." + key[4:]) == value
        if setting_at(cfg, key) == value and not inherited:
            problems.append(f"{key}={value} cannot be honoured: {why}.")
    return problems
