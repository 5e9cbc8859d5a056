"""grpo_device: CUDA / Ascend NPU / CPU abstraction, allocator settings and environment profiles."""

from grpo_device.alloc_conf import npu_alloc_conf_conflicts, parse_alloc_conf
from grpo_device.allocator import AllocatorSettingsError, read_expandable_segments, set_expandable_segments
from grpo_device.env_profile import AppliedEnv, EnvProfile
from grpo_device.kinds import (
    DeviceKind,
    DeviceUnavailableError,
    InvalidDeviceError,
    detect,
    parse_device_kind,
)
from grpo_device.memory import MemoryStats, memory_stats, reset_peak_memory, total_memory_bytes
from grpo_device.runtime import (
    comm_backend,
    current_device,
    device_count,
    device_rng_state,
    empty_cache,
    manual_seed_all,
    ray_resource_name,
    set_device,
    set_device_rng_state,
    synchronize,
    torch_device,
    torch_device_module,
    visible_devices_env,
)
from grpo_device.version import __version__

__all__ = [
    "AllocatorSettingsError",
    "AppliedEnv",
    "DeviceKind",
    "DeviceUnavailableError",
    "EnvProfile",
    "InvalidDeviceError",
    "MemoryStats",
    "__version__",
    "comm_backend",
    "current_device",
    "detect",
    "device_count",
    "device_rng_state",
    "empty_cache",
    "manual_seed_all",
    "memory_stats",
    "npu_alloc_conf_conflicts",
    "parse_alloc_conf",
    "parse_device_kind",
    "ray_resource_name",
    "read_expandable_segments",
    "reset_peak_memory",
    "set_device",
    "set_device_rng_state",
    "set_expandable_segments",
    "synchronize",
    "torch_device",
    "torch_device_module",
    "total_memory_bytes",
    "visible_devices_env",
]
