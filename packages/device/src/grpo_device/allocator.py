"""Switching the caching allocator's expandable segments at runtime, and reading it back.

The derivation: docs/INTERNALS.md, `grpo_device.allocator`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import structlog
import torch

from grpo_device.alloc_conf import EXPANDABLE_SEGMENTS, expandable_segments_in, npu_expandable_blockers
from grpo_device.kinds import DeviceKind, resolve_kind
from grpo_device.runtime import torch_device_module

log = structlog.get_logger()

NPU_ALLOC_CONF_ENV = "PYTORCH_NPU_ALLOC_CONF"


class AllocatorSettingsError(RuntimeError):
    """expandable_segments could not be set (raised only with strict=True)."""


def _cuda_setter() -> Callable[[str], object]:
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is not None:
        return setter
    legacy = torch.cuda.memory._set_allocator_settings

    def set_quietly(settings: str) -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return legacy(settings)

    return set_quietly


def _npu_setter() -> Callable[[str], object]:
    return torch_device_module(DeviceKind.NPU).memory._set_allocator_settings


def _read_cuda() -> bool | None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        settings = torch.cuda.memory._snapshot().get("allocator_settings") or {}
        if EXPANDABLE_SEGMENTS in settings:
            return bool(settings[EXPANDABLE_SEGMENTS])
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    return None if getter is None else expandable_segments_in(getter())


def read_expandable_segments(kind: DeviceKind | str | None = None) -> bool | None:
    """Whether the allocator uses expandable segments; None where torch cannot tell (NPU, CPU)."""
    device = resolve_kind(kind)
    if device is not DeviceKind.CUDA:
        return None
    try:
        return _read_cuda()
    except Exception as exc:  # a read-back must never break the caller
        log.warning("expandable_segments_readback_failed", device=device.value, error=repr(exc))
        return None


def _check_npu_conflict() -> None:
    conf = os.environ.get(NPU_ALLOC_CONF_ENV, "")
    blockers = npu_expandable_blockers(conf)
    if blockers:
        raise AllocatorSettingsError(
            f"{NPU_ALLOC_CONF_ENV}={conf!r} sets {', '.join(blockers)}, which Ascend forbids together "
            "with expandable_segments:True; remove them from the variable or keep expandable segments off"
        )


def _fail(device: DeviceKind, enable: bool, exc: Exception, *, strict: bool) -> bool:
    if strict:
        raise AllocatorSettingsError(
            f"could not set expandable_segments={enable} on {device.value}: {exc!r}; fix the cause "
            "or pass strict=False to continue with the allocator as it is"
        ) from exc
    log.warning("expandable_segments_failed", device=device.value, requested=enable, error=repr(exc))
    return False


def set_expandable_segments(
    enable: bool, *, strict: bool = False, kind: DeviceKind | str | None = None
) -> bool:
    """Turn the allocator's expandable segments on or off; True when applied.

    On failure (no such API, torch raising, an NPU config conflict, or a read-back that disagrees)
    logs one structured warning with the device, the requested value and the exception, and
    returns False; with strict=True raises AllocatorSettingsError chaining the cause instead.
    CPU has no such allocator: an info log, False, never an error.
    """
    if not isinstance(enable, bool):
        raise ValueError(f"enable={enable!r} must be True or False")
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        log.info("expandable_segments_skipped", device=device.value, requested=enable, reason="cpu")
        return False
    settings = f"{EXPANDABLE_SEGMENTS}:{enable}"
    try:
        if device is DeviceKind.NPU:
            if enable:
                _check_npu_conflict()
            _npu_setter()(settings)
        else:
            _cuda_setter()(settings)
    except Exception as exc:
        return _fail(device, enable, exc, strict=strict)
    effective = read_expandable_segments(device)
    if effective is not None and effective != enable:
        mismatch = AllocatorSettingsError(
            f"the allocator reports expandable_segments={effective} after the call"
        )
        return _fail(device, enable, mismatch, strict=strict)
    log.info("expandable_segments_set", device=device.value, requested=enable, verified=effective is not None)
    return True
