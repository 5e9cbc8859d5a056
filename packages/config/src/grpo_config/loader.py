"""`load`: YAML file or mapping + dotted overrides -> a resolved, validated TrainerConfig."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_config.build import build_section
from grpo_config.errors import ConfigError
from grpo_config.inherit import build_ref
from grpo_config.schema import TrainerConfig
from grpo_config.sources import FlatConfig, collect, read_source
from grpo_config.validate import validate


def build(flat: FlatConfig) -> TrainerConfig:
    """The typed config of collected keys, ref inheritance resolved, not yet validated."""
    nested = flat.nested()
    raw_ref = nested.pop("ref", None)
    try:
        cfg = build_section(TrainerConfig, nested, "")
        if raw_ref is not None and not isinstance(raw_ref, Mapping):
            raise ConfigError(
                f"Config key 'ref' has value {raw_ref!r} but expects a mapping (RefConfig section).",
                key="ref",
            )
        return build_ref(cfg, raw_ref or {})
    except ConfigError as exc:
        written = flat.written_name(exc.key) if exc.key else None
        if written is None:
            raise
        raise ConfigError(f"{exc} (It was given as '{written}'.)", key=exc.key) from None


def load(
    source: str | Path | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    *,
    num_experts: int | None = None,
) -> TrainerConfig:
    """Read `source` (a YAML file path, a mapping, or None for all defaults), apply the dotted
    `overrides` (`a.b.c=value`, verl-style alias keys accepted), resolve ref inheritance, and run the
    cross-field checks (`num_experts`, when known, is checked against `parallel.ep`).

    Raises ConfigError (a ValueError) with the dotted key and the fix.
    """
    cfg = build(collect(read_source(source), overrides))
    validate(cfg, num_experts=num_experts)
    return cfg
