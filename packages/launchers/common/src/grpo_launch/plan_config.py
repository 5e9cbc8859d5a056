"""Which config.json the memory plan counts, and what the reader is told about it.

The derivation: docs/INTERNALS.md, `grpo_launch.plan_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Values that fix the parameter count and the parallel layout (text config of a vision-language
# checkpoint). `architectures` / `model_type` are read from the top level.
ARCHITECTURE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "layer_types",
)
_TOP_KEYS = ("architectures", "model_type")


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """The directory whose config.json is counted (None: neither exists) and how to describe it."""

    directory: Path | None
    description: dict[str, Any] = field(default_factory=dict)
    differences: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_config(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "config.json").read_text())


def architecture_values(config: dict[str, Any]) -> dict[str, Any]:
    """The architecture values of a config.json (top level, then its text config)."""
    text = config.get("text_config") or config
    values = {key: config.get(key) for key in _TOP_KEYS}
    values.update({key: text.get(key) for key in ARCHITECTURE_KEYS})
    return values


def architecture_differences(checkpoint: dict[str, Any], shipped: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Key -> {"yours": ..., "shipped": ...} for every architecture value that differs."""
    yours, published = architecture_values(checkpoint), architecture_values(shipped)
    return {
        key: {"yours": _short(yours[key]), "shipped": _short(published[key])}
        for key in published
        if yours[key] != published[key]
    }


def choose_plan_config(model_path: str | Path, architecture: Path | None) -> PlanConfig:
    """The checkpoint's config.json when it exists (compared with `architecture`), else `architecture`'s."""
    checkpoint = Path(model_path).expanduser()
    if (checkpoint / "config.json").is_file():
        description: dict[str, Any] = {
            "path": str(checkpoint / "config.json"),
            "source": "your checkpoint (actor.model_path)",
        }
        differences: dict[str, dict[str, Any]] = {}
        if architecture is not None and (architecture / "config.json").is_file():
            try:
                differences = architecture_differences(read_config(checkpoint), read_config(architecture))
            except (ValueError, OSError):  # unreadable: the plan's own count says why
                differences = {}
            if differences:
                description["differs_from_shipped"] = differences
                description["shipped_path"] = str(architecture / "config.json")
        return PlanConfig(directory=checkpoint, description=description, differences=differences)
    if architecture is not None and (architecture / "config.json").is_file():
        return PlanConfig(
            directory=architecture,
            description={
                "path": str(architecture / "config.json"),
                "source": (
                    "the architecture config shipped with the launcher (the published model's shape, "
                    f"no weights), not your checkpoint: actor.model_path={model_path} has no config.json yet"
                ),
            },
        )
    return PlanConfig(directory=None)


def _short(value: Any) -> Any:
    """A long repeating list (layer types) as "N x [its period]"; anything else as it is."""
    if isinstance(value, list) and len(value) > 4:
        for period in range(1, len(value) // 2 + 1):
            if len(value) % period == 0 and value == value[:period] * (len(value) // period):
                return f"{len(value) // period} x {value[:period]}"
    return value
