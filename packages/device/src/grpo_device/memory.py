"""Memory statistics: the caching allocator on CUDA/NPU, the process RSS on CPU."""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass

from grpo_device.kinds import DeviceKind, resolve_kind
from grpo_device.runtime import torch_device_module

_MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MemoryStats:
    """Bytes; `source` says what was measured.

    source "allocator": torch's caching allocator of the device (allocated = live tensors,
    reserved = held by the allocator, peaks since the last reset_peak_memory()).
    source "process_rss": a CPU run; allocated == reserved == resident set size of this process,
    both peaks == the OS's peak RSS (cannot be reset).
    """

    device: DeviceKind
    source: str
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int

    def as_mib(self) -> dict[str, float]:
        """The four byte counts in MiB, for metrics."""
        return {
            "allocated_mib": self.allocated_bytes / _MIB,
            "reserved_mib": self.reserved_bytes / _MIB,
            "peak_allocated_mib": self.peak_allocated_bytes / _MIB,
            "peak_reserved_mib": self.peak_reserved_bytes / _MIB,
        }


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()  # no procfs (macOS): the peak is the best we have


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def memory_stats(kind: DeviceKind | str | None = None, *, index: int | None = None) -> MemoryStats:
    """Memory of device `index` (None: the current device) or, on CPU, of this process."""
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        rss, peak = _current_rss_bytes(), _peak_rss_bytes()
        return MemoryStats(
            device=device,
            source="process_rss",
            allocated_bytes=rss,
            reserved_bytes=rss,
            peak_allocated_bytes=max(peak, rss),
            peak_reserved_bytes=max(peak, rss),
        )
    module = torch_device_module(device)
    return MemoryStats(
        device=device,
        source="allocator",
        allocated_bytes=int(module.memory_allocated(index)),
        reserved_bytes=int(module.memory_reserved(index)),
        peak_allocated_bytes=int(module.max_memory_allocated(index)),
        peak_reserved_bytes=int(module.max_memory_reserved(index)),
    )


def reset_peak_memory(kind: DeviceKind | str | None = None, *, index: int | None = None) -> bool:
    """Restart peak tracking; False on CPU, where the OS's peak RSS cannot be reset."""
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        return False
    torch_device_module(device).reset_peak_memory_stats(index)
    return True


def total_memory_bytes(kind: DeviceKind | str | None = None, *, index: int = 0) -> int | None:
    """The memory of accelerator `index` of the kind (what a plan must fit in); None on CPU."""
    device = resolve_kind(kind)
    if device is DeviceKind.CPU:
        return None
    return int(torch_device_module(device).get_device_properties(index).total_memory)
