"""The device kind a run uses: `device.kind` from the config, or detected when it is "auto"."""

from __future__ import annotations

import grpo_device
from grpo_config.schema import TrainerConfig

__all__ = ["resolve_device_kind"]

AUTO = "auto"


def resolve_device_kind(cfg: TrainerConfig) -> grpo_device.DeviceKind:
    """`device.kind` "auto" -> `grpo_device.detect()` (the `DEVICE` variable, then NPU, CUDA, CPU);
    any other value -> parsed (gpu/cuda, npu, cpu; case-insensitive)."""
    kind = cfg.device.kind
    if str(kind).strip().lower() == AUTO:
        return grpo_device.detect()
    return grpo_device.parse_device_kind(kind, source="device.kind")
