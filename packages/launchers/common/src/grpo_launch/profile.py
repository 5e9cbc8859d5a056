"""A launcher's model profile: what every device shares, plus what each device changes.

A profile is plain data (nested dicts in `grpo_config` field names) so that a launcher package is a
table of values and nothing else; `grpo_config.load` type-checks and validates it like any YAML.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_device import DeviceKind

# CLI device names -> `grpo_config.DeviceConfig.kind` / `grpo_device.DeviceKind` values.
DEVICE_KINDS: Mapping[str, str] = {
    "gpu": DeviceKind.CUDA.value,
    "npu": DeviceKind.NPU.value,
    "cpu": DeviceKind.CPU.value,
}


# Differences from the seed verl recipes that every launch profile makes, with the reason.
SHARED_RECIPE_DIFFERENCES: Mapping[str, str] = {
    "project_name": "grpo's run names: they name the output folder and the TensorBoard run",
    "experiment_name": "grpo's run names: they name the output folder and the TensorBoard run",
    "actor.trust_remote_code": "Qwen3.5 is a transformers class (>= 5): no remote code is run",
    "checkpoint.dir": "the launcher puts checkpoints under --output-dir (<output-dir>/checkpoints)",
    "logging.wandb": "the seeds log to Weights & Biases (trainer.logger 'wandb'), which needs an account and the "
    "network; the launchers log to the console, metrics.jsonl and TensorBoard, and logging.wandb=true adds W&B",
    "logging.tensorboard": "TensorBoard stands in for the seeds' Weights & Biases dashboard: it needs no account",
}
LOCAL_LAYERS_ON_GPU = (
    "the GPU runs use grpo's local layers (SDPA attention, grouped GEMM experts, FLA's Gated DeltaNet), the "
    "only ones ever run on the GPU machine; TransformerEngine's have not run there yet (its build: "
    "docs/benchmarks.md, issue 46): set actor.megatron.transformer_impl=transformer_engine to try them"
)
MINDSPEED_OPTIONS = (
    "use_flash_attn / use_naive_l2norm are MindSpeed options, not megatron-core TransformerConfig "
    "fields: grpo does not forward them"
)


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """A new nested dict: `update` over `base`, recursing where both sides hold a mapping. Values are
    deep-copied, so neither input is ever aliased by the result."""
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass(frozen=True, kw_only=True)
class DeviceDelta:
    """What one device changes relative to the model's common profile: config values (nested, merged
    over the common ones) and environment variables (merged over `grpo_device.EnvProfile`)."""

    config: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    # dotted grpo key -> why this device's value differs from the seed recipe's (see LaunchProfile).
    recipe_differences: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LaunchProfile:
    """One model's launch recipe. `devices` is keyed by CLI device name ("gpu", "npu")."""

    launcher: str  # the command name, e.g. "grpo-launch-35b"
    model_id: str  # Hugging Face id, e.g. "Qwen/Qwen3.5-35B-A3B"
    dataset: str  # a `grpo_launch.prepare_data` dataset name, e.g. "geo3k"
    num_experts: int | None  # routed experts per MoE layer; checked against expert parallelism
    common: Mapping[str, Any]
    devices: Mapping[str, DeviceDelta]
    # The directory of the model's published config.json (architecture only, no weights), shipped as
    # the launcher package's data: the memory plan counts it while actor.model_path has no checkpoint.
    architecture: Path | None = None
    # The profile carries the seed verl recipe's values; each deliberate difference is listed here,
    # dotted grpo key -> the reason (tests/test_profiles_match_recipes.py holds them to it).
    recipe_differences: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.devices) - (set(DEVICE_KINDS) - {"cpu"})
        assert not unknown, f"{self.launcher}: device deltas for unknown devices {sorted(unknown)}"

    @property
    def model_name(self) -> str:
        """The last part of the model id: the default model directory name."""
        return self.model_id.rsplit("/", 1)[-1]

    def supported_devices(self) -> list[str]:
        return sorted(self.devices)

    def config_for(self, device: str) -> dict[str, Any]:
        """The common values with `device`'s delta merged over them (a fresh nested dict)."""
        if device not in self.devices:
            raise ValueError(
                f"{self.launcher} has no full-size profile for device {device!r}; it supports "
                f"{', '.join(self.supported_devices())}. Use --preset tiny to run on the CPU."
            )
        return deep_merge(self.common, self.devices[device].config)

    def differences_for(self, device: str) -> dict[str, str]:
        """Every deliberate difference from `device`'s seed recipe, with its reason."""
        delta = self.devices.get(device)
        own = delta.recipe_differences if delta else {}
        return {**SHARED_RECIPE_DIFFERENCES, **self.recipe_differences, **own}

    def env_for(self, device: str) -> dict[str, str]:
        """The environment variables `device`'s delta sets on top of the device's EnvProfile."""
        delta = self.devices.get(device)
        return dict(delta.env) if delta else {}
