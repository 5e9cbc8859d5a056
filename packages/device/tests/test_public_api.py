"""The public surface of grpo_device is deliberate: changing it means changing this list."""

from __future__ import annotations

import grpo_device


def test_all_is_frozen() -> None:
    assert sorted(grpo_device.__all__) == [
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


def test_every_name_in_all_exists() -> None:
    missing = [name for name in grpo_device.__all__ if not hasattr(grpo_device, name)]
    assert missing == []
