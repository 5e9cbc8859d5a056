"""Device kinds and detection (`DEVICE` override, then NPU, then CUDA, then CPU)."""

from __future__ import annotations

import enum
import importlib
import os
from collections.abc import Mapping
from types import ModuleType

import structlog
import torch

log = structlog.get_logger()

DEVICE_ENV_VAR = "DEVICE"


class InvalidDeviceError(ValueError):
    """A device name (from `DEVICE`, a CLI flag or a config) is not one we know."""


class DeviceUnavailableError(ValueError):
    """The device asked for explicitly is not usable in this process."""


class DeviceKind(enum.StrEnum):
    CUDA = "cuda"
    NPU = "npu"
    CPU = "cpu"

    @property
    def comm_backend(self) -> str:
        return _COMM_BACKENDS[self]

    @property
    def ray_resource_name(self) -> str | None:
        return _RAY_RESOURCES[self]

    @property
    def visible_devices_env(self) -> str | None:
        return _VISIBLE_DEVICES_ENV[self]


_COMM_BACKENDS = {DeviceKind.CUDA: "nccl", DeviceKind.NPU: "hccl", DeviceKind.CPU: "gloo"}
_RAY_RESOURCES = {DeviceKind.CUDA: "GPU", DeviceKind.NPU: "NPU", DeviceKind.CPU: None}
_VISIBLE_DEVICES_ENV = {
    DeviceKind.CUDA: "CUDA_VISIBLE_DEVICES",
    DeviceKind.NPU: "ASCEND_RT_VISIBLE_DEVICES",
    DeviceKind.CPU: None,
}
_ALIASES = {"gpu": DeviceKind.CUDA, "cuda": DeviceKind.CUDA, "npu": DeviceKind.NPU, "cpu": DeviceKind.CPU}
VALID_DEVICE_NAMES = tuple(sorted(_ALIASES))


def parse_device_kind(value: str | DeviceKind, *, source: str = "device") -> DeviceKind:
    """`gpu`/`cuda`/`npu`/`cpu` (any case, surrounding blanks ignored) -> `DeviceKind`."""
    if isinstance(value, DeviceKind):
        return value
    kind = _ALIASES.get(str(value).strip().lower())
    if kind is None:
        raise InvalidDeviceError(
            f"{source}={value!r} is not a valid device; use one of {', '.join(VALID_DEVICE_NAMES)} "
            "(case-insensitive), or leave it unset to detect the device."
        )
    return kind


def import_torch_npu() -> ModuleType | None:
    """torch_npu if it imports, else None; a broken install (not a missing one) is logged."""
    try:
        return importlib.import_module("torch_npu")
    except ModuleNotFoundError as exc:
        if exc.name != "torch_npu":
            log.warning("torch_npu_import_failed", error=repr(exc))
        return None
    except Exception as exc:  # a broken CANN install raises ImportError/OSError/RuntimeError
        log.warning("torch_npu_import_failed", error=repr(exc))
        return None


def npu_module() -> ModuleType:
    """`torch.npu` (registered by torch_npu); raises DeviceUnavailableError without torch_npu."""
    torch_npu = import_torch_npu()
    if torch_npu is None:
        raise DeviceUnavailableError(
            "NPU requested but torch_npu is not importable; install torch_npu (Ascend Extension for "
            "PyTorch) matching your torch and CANN, or set DEVICE=gpu|cpu."
        )
    return getattr(torch, "npu", None) or torch_npu.npu


def npu_visible() -> bool:
    """torch_npu importable AND at least one NPU visible to this process."""
    torch_npu = import_torch_npu()
    if torch_npu is None:
        return False
    npu = getattr(torch, "npu", None) or torch_npu.npu
    try:
        return bool(npu.is_available()) and int(npu.device_count()) > 0
    except Exception as exc:  # driver errors surface here rather than at import
        log.warning("npu_probe_failed", error=repr(exc))
        return False


def _require_available(kind: DeviceKind) -> None:
    if kind is DeviceKind.NPU and not npu_visible():
        raise DeviceUnavailableError(
            "DEVICE=npu but no NPU is usable (torch_npu missing or no device visible; check "
            "ASCEND_RT_VISIBLE_DEVICES and npu-smi), or unset DEVICE to detect."
        )
    if kind is DeviceKind.CUDA and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            "DEVICE=gpu but torch.cuda.is_available() is False (CPU-only torch build, no driver, or "
            "CUDA_VISIBLE_DEVICES hides every GPU); fix that, or unset DEVICE to detect."
        )


def detect(*, environ: Mapping[str, str] | None = None) -> DeviceKind:
    """The device this process should use.

    `DEVICE` (gpu|cuda|npu|cpu) wins and must name a usable device; otherwise NPU when torch_npu
    imports and an NPU is visible, then CUDA when available, else CPU.
    """
    env = os.environ if environ is None else environ
    requested = env.get(DEVICE_ENV_VAR, "").strip()
    if requested:
        kind = parse_device_kind(requested, source=DEVICE_ENV_VAR)
        _require_available(kind)
        return kind
    if npu_visible():
        return DeviceKind.NPU
    if torch.cuda.is_available():
        return DeviceKind.CUDA
    return DeviceKind.CPU


def resolve_kind(kind: DeviceKind | str | None) -> DeviceKind:
    """None -> detect(); a name -> parsed; a DeviceKind -> itself."""
    return detect() if kind is None else parse_device_kind(kind)
