"""The device kind a run uses: `device.kind` from the config, or detected when it is "auto" (once,
by the driver: `with_device_kind`)."""

from __future__ import annotations

import dataclasses

import grpo_device
from grpo_config.schema import TrainerConfig

__all__ = ["resolve_device_kind", "with_device_kind"]

AUTO = "auto"


def resolve_device_kind(cfg: TrainerConfig) -> grpo_device.DeviceKind:
    """`device.kind` "auto" -> `grpo_device.detect()` (the `DEVICE` variable, then NPU, CUDA, CPU);
    any other value -> parsed (gpu/cuda, npu, cpu; case-insensitive)."""
    kind = cfg.device.kind
    if str(kind).strip().lower() == AUTO:
        return grpo_device.detect()
    return grpo_device.parse_device_kind(kind, source="device.kind")


def with_device_kind(cfg: TrainerConfig) -> TrainerConfig:
    """`cfg` with `device.kind` resolved: detected here once when "auto", so that every worker reads
    the kind the driver placed it by instead of detecting again."""
    kind = resolve_device_kind(cfg).value
    return cfg if cfg.device.kind == kind else dataclasses.replace(cfg, device=dataclasses.replace(cfg.device, kind=kind))
