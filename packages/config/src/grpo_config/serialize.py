"""Config -> plain dict / YAML (the inverse of `load` for a resolved config)."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml


def to_dict(cfg: Any) -> dict[str, Any]:
    """A nested dict of plain values (lists and dicts copied) for any config dataclass."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"to_dict expects a config dataclass instance, got {type(cfg).__name__}")
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Any) -> str:
    """YAML text, a blank line before each section; `load` reads it back to an equal config."""
    groups: list[dict[str, Any]] = [{}]
    for key, value in to_dict(cfg).items():
        if isinstance(value, dict):
            groups.append({key: value})
            groups.append({})
        else:
            groups[-1][key] = value
    return "\n".join(
        yaml.safe_dump(group, sort_keys=False, default_flow_style=False, allow_unicode=True)
        for group in groups
        if group
    )
