"""Per-device torch entry points: module, torch.device, current device, backends, counts, sync,
seeding and the device generators' state.

Every function takes an optional `kind` (a DeviceKind or a name such as "gpu"); None detects it.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from grpo_device.kinds import DeviceKind, DeviceUnavailableError, npu_module, resolve_kind


def torch_device_module(kind: DeviceKind | str | None = None) -> ModuleType:
    """`torch.cuda`, `torch.npu` (needs torch_npu) or `torch.cpu`."""
    device = resolve_kind(kind)
    if device is DeviceKind.CUDA:
        return torch.cuda
    if device is DeviceKind.NPU:
        return npu_module()
    return torch.cpu


def torch_device(kind: DeviceKind | str | None = None, *, index: int = 0) -> torch.device:
    """`torch.device` for the kind; CPU ignores `index` (there is one CPU device)."""
    if index < 0:
        raise ValueError(f"index={index} must be >= 0")
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        return torch.device("cpu")
    if device is DeviceKind.NPU:
        npu_module()  # importing torch_npu registers the "npu" device type with torch
        try:
            return torch.device("npu", index)
        except RuntimeError as exc:
            raise DeviceUnavailableError(
                f"torch does not know the 'npu' device type ({exc}); torch_npu did not register it"
            ) from exc
    return torch.device(device.value, index)


def set_device(index: int, *, kind: DeviceKind | str | None = None) -> None:
    """Make accelerator `index` this process's current device (`torch.cuda.set_device` /
    `torch.npu.set_device`); a no-op on CPU."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"index={index!r} must be a non-negative int")
    device = resolve_kind(kind)
    if device is not DeviceKind.CPU:
        torch_device_module(device).set_device(index)


def current_device(kind: DeviceKind | str | None = None) -> torch.device:
    """The accelerator this process uses (its current device), or `cpu` on CPU."""
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        return torch.device("cpu")
    return torch_device(device, index=int(torch_device_module(device).current_device()))


def comm_backend(kind: DeviceKind | str | None = None) -> str:
    """torch.distributed backend: nccl (CUDA), hccl (NPU), gloo (CPU)."""
    return resolve_kind(kind).comm_backend


def ray_resource_name(kind: DeviceKind | str | None = None) -> str | None:
    """Ray custom resource that counts the devices: GPU, NPU, or None on CPU."""
    return resolve_kind(kind).ray_resource_name


def visible_devices_env(kind: DeviceKind | str | None = None) -> str | None:
    """CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES, or None on CPU."""
    return resolve_kind(kind).visible_devices_env


def device_count(kind: DeviceKind | str | None = None) -> int:
    """Accelerators visible to this process; 0 on CPU (CPU workers are sized by process count)."""
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        return 0
    return int(torch_device_module(device).device_count())


def empty_cache(kind: DeviceKind | str | None = None) -> None:
    """Release cached, unused device memory back to the driver; no-op on CPU."""
    device = resolve_kind(kind)
    if device is not DeviceKind.CPU:
        torch_device_module(device).empty_cache()


def synchronize(kind: DeviceKind | str | None = None) -> None:
    """Wait for all queued work on the current device; no-op on CPU."""
    device = resolve_kind(kind)
    if device is not DeviceKind.CPU:
        torch_device_module(device).synchronize()


def manual_seed_all(seed: int, *, kind: DeviceKind | str | None = None) -> None:
    """Seed torch's CPU generator and every device generator of the kind."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    device = resolve_kind(kind)
    torch.manual_seed(seed)
    if device is not DeviceKind.CPU:
        torch_device_module(device).manual_seed_all(seed)


def device_rng_state(kind: DeviceKind | str | None = None) -> list[torch.Tensor]:
    """The generator state of every visible accelerator of the kind (`get_rng_state_all`), as CPU
    byte tensors; [] on CPU, whose generator is `torch.get_rng_state()`."""
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        return []
    return [state.cpu() for state in torch_device_module(device).get_rng_state_all()]


def set_device_rng_state(states: Sequence[torch.Tensor], *, kind: DeviceKind | str | None = None) -> None:
    """Restore what `device_rng_state` returned: one state per visible accelerator, same count."""
    device = resolve_kind(kind)
    expected = device_count(device)
    if len(states) != expected:
        raise ValueError(
            f"{len(states)} device RNG states for {expected} visible {device.value} devices; restore "
            "them only where as many devices are visible as when they were captured"
        )
    if device is not DeviceKind.CPU:
        torch_device_module(device).set_rng_state_all(list(states))
