"""Runtime helpers on real torch (CPU) and on the FAKE torch_npu from conftest."""

from __future__ import annotations

import pytest
import torch

from grpo_device import (
    DeviceKind,
    DeviceUnavailableError,
    comm_backend,
    device_count,
    empty_cache,
    manual_seed_all,
    memory_stats,
    ray_resource_name,
    reset_peak_memory,
    synchronize,
    torch_device,
    torch_device_module,
    visible_devices_env,
)


@pytest.mark.parametrize(
    ("kind", "backend", "resource", "visible"),
    [
        ("gpu", "nccl", "GPU", "CUDA_VISIBLE_DEVICES"),
        ("npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES"),
        ("cpu", "gloo", None, None),
    ],
)
def test_per_device_names(kind: str, backend: str, resource: str | None, visible: str | None) -> None:
    assert comm_backend(kind) == backend
    assert ray_resource_name(kind) == resource
    assert visible_devices_env(kind) == visible


def test_kind_none_detects(no_npu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert comm_backend() == "gloo"
    assert ray_resource_name() is None


def test_torch_device_per_kind() -> None:
    assert torch_device("cpu", index=3) == torch.device("cpu")
    assert torch_device(DeviceKind.CUDA, index=1) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="index=-1 must be >= 0"):
        torch_device("cuda", index=-1)


def test_torch_device_module_per_kind(fake_npu) -> None:
    assert torch_device_module("cuda") is torch.cuda
    assert torch_device_module("cpu") is torch.cpu
    assert torch_device_module("npu") is torch.npu
    assert torch_device_module("npu").device_count() == 16


def test_npu_module_without_torch_npu_says_what_to_install(no_npu) -> None:
    with pytest.raises(DeviceUnavailableError, match="install torch_npu"):
        torch_device_module("npu")


def test_device_count(fake_npu) -> None:
    assert device_count("cpu") == 0
    assert device_count("npu") == 16


def test_cache_sync_and_seed_reach_the_npu_module(fake_npu) -> None:
    empty_cache("npu")
    synchronize("npu")
    manual_seed_all(1234, kind="npu")
    assert (fake_npu.cache_emptied, fake_npu.synchronized, fake_npu.seeds) == (1, 1, [1234])


def test_manual_seed_all_makes_cpu_draws_repeat() -> None:
    manual_seed_all(7, kind="cpu")
    first = torch.rand(4)
    manual_seed_all(7, kind="cpu")
    assert torch.equal(first, torch.rand(4))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="must be a non-negative int"):
            manual_seed_all(bad, kind="cpu")


def test_cpu_memory_stats_follow_the_process_rss() -> None:
    before = memory_stats("cpu")
    block = torch.ones(50 * 1024 * 1024, dtype=torch.float32)  # 200 MiB, touched
    after = memory_stats("cpu")
    assert before.source == after.source == "process_rss"
    assert after.allocated_bytes - before.allocated_bytes > 150 * 1024 * 1024
    assert after.peak_allocated_bytes >= after.allocated_bytes
    assert reset_peak_memory("cpu") is False
    del block


def test_npu_memory_stats_come_from_the_allocator(fake_npu) -> None:
    stats = memory_stats("npu")
    assert (stats.source, stats.allocated_bytes, stats.reserved_bytes) == ("allocator", 1_000, 4_000)
    assert (stats.peak_allocated_bytes, stats.peak_reserved_bytes) == (2_000, 8_000)
    assert stats.as_mib()["reserved_mib"] == pytest.approx(4_000 / 2**20)
    assert reset_peak_memory("npu") is True
    assert fake_npu.peak_resets == 1
