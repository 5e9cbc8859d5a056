"""Runtime helpers on real torch (CPU) and on the FAKE torch_npu from conftest."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from grpo_device import (
    DeviceKind,
    DeviceUnavailableError,
    comm_backend,
    current_device,
    device_count,
    device_rng_state,
    empty_cache,
    manual_seed_all,
    memory_stats,
    ray_resource_name,
    reset_peak_memory,
    set_device,
    set_device_rng_state,
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


def test_set_device_goes_through_the_npu_module(fake_npu) -> None:
    set_device(3, kind="npu")
    assert fake_npu.set_device_calls == [3]
    assert torch_device_module("npu").current_device() == 3


_NPU_DEVICE_SCRIPT = """
import sys, types
import torch

state = {"current": 0}
npu = types.ModuleType("torch_npu.npu")
npu.is_available = lambda: True
npu.device_count = lambda: 16
npu.set_device = lambda index: state.update(current=index)
npu.current_device = lambda: state["current"]
torch_npu = types.ModuleType("torch_npu")
torch_npu.npu = npu
sys.modules["torch_npu"] = torch_npu
torch.utils.rename_privateuse1_backend("npu")  # what the real torch_npu does on import
torch._register_device_module("npu", npu)

import grpo_device

grpo_device.set_device(3, kind="npu")
print(grpo_device.current_device("npu"), grpo_device.torch_device("npu", index=1))
"""


def test_current_device_is_an_npu_device_in_a_process_of_its_own() -> None:
    """A FAKE torch_npu (no NPU here) that registers "npu" with torch as the real one does: that
    registration is permanent, so it runs in a subprocess (see conftest)."""
    result = subprocess.run(
        [sys.executable, "-c", _NPU_DEVICE_SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["npu:3", "npu:1"]


def test_set_device_and_current_device_on_cuda(monkeypatch) -> None:
    """No GPU here: torch.cuda's two calls are recording stand-ins."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    set_device(5, kind="gpu")
    assert calls == [5]
    assert current_device("cuda") == torch.device("cuda", 5)


def test_cpu_has_one_device_and_nothing_to_set() -> None:
    set_device(0, kind="cpu")
    assert current_device("cpu") == torch.device("cpu")
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="must be a non-negative int"):
            set_device(bad, kind="cpu")


def test_device_rng_state_round_trip_on_npu(fake_npu) -> None:
    saved = device_rng_state("npu")
    assert [int(state[0]) for state in saved] == list(range(16))
    fake_npu.rng_states = [torch.zeros(8, dtype=torch.uint8)] * 16
    set_device_rng_state(saved, kind="npu")
    assert [int(state[0]) for state in fake_npu.rng_states] == list(range(16))
    with pytest.raises(ValueError, match="2 device RNG states for 16 visible npu devices"):
        set_device_rng_state(saved[:2], kind="npu")


def test_device_rng_state_on_cuda_uses_torch_cuda(monkeypatch) -> None:
    states = [torch.full((4,), 7, dtype=torch.uint8), torch.full((4,), 9, dtype=torch.uint8)]
    restored: list[list[torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    saved = device_rng_state("cuda")
    set_device_rng_state(saved, kind="cuda")
    assert [[int(s[0]) for s in call] for call in restored] == [[7, 9]]


def test_cpu_has_no_device_generators() -> None:
    assert device_rng_state("cpu") == []
    set_device_rng_state([], kind="cpu")
    with pytest.raises(ValueError, match="1 device RNG states for 0 visible cpu devices"):
        set_device_rng_state([torch.zeros(8, dtype=torch.uint8)], kind="cpu")
