"""Fixtures for grpo_device tests.

torch_npu cannot exist on these machines (it needs Ascend hardware and CANN), so NPU paths are
exercised with a FAKE `torch_npu` module injected into sys.modules (and `torch.npu`) by the
`fake_npu` fixture. Everything else uses the real torch. The fake does not register the "npu" device
type with torch (torch_npu does: `torch.utils.rename_privateuse1_backend("npu")`): that cannot be
undone and makes torch treat "npu" as the process's accelerator (torch.optim then fails in every
later test), so `torch.device("npu")` is only built in a subprocess (test_runtime).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch


@dataclass
class FakeNpu:
    """Records what grpo_device asks of the fake torch_npu; `set_error` makes the setter raise."""

    available: bool = True
    count: int = 16
    set_error: Exception | None = None
    allocator_calls: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    cache_emptied: int = 0
    synchronized: int = 0
    peak_resets: int = 0
    current: int = 0
    set_device_calls: list[int] = field(default_factory=list)
    rng_states: list[torch.Tensor] = field(default_factory=list)

    def build(self) -> types.ModuleType:
        module = types.ModuleType("torch_npu")
        npu = types.ModuleType("torch_npu.npu")
        memory = types.ModuleType("torch_npu.npu.memory")

        def set_allocator_settings(settings: str) -> None:
            if self.set_error is not None:
                raise self.set_error
            self.allocator_calls.append(settings)

        memory._set_allocator_settings = set_allocator_settings
        npu.memory = memory
        npu.is_available = lambda: self.available
        npu.device_count = lambda: self.count if self.available else 0
        npu.empty_cache = lambda: setattr(self, "cache_emptied", self.cache_emptied + 1)
        npu.synchronize = lambda: setattr(self, "synchronized", self.synchronized + 1)
        npu.manual_seed_all = self.seeds.append
        npu.reset_peak_memory_stats = lambda index=None: setattr(self, "peak_resets", self.peak_resets + 1)
        npu.memory_allocated = lambda index=None: 1_000
        npu.memory_reserved = lambda index=None: 4_000
        npu.max_memory_allocated = lambda index=None: 2_000
        npu.max_memory_reserved = lambda index=None: 8_000

        def set_device(index: int) -> None:
            self.set_device_calls.append(index)
            self.current = index

        def set_rng_state_all(states: list[torch.Tensor]) -> None:
            self.rng_states = [state.clone() for state in states]

        npu.set_device = set_device
        npu.current_device = lambda: self.current
        npu.get_rng_state_all = lambda: [state.clone() for state in self.rng_states]
        npu.set_rng_state_all = set_rng_state_all
        module.npu = npu
        return module


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DEVICE / allocator variables from the machine running the tests."""
    for name in ("DEVICE", "PYTORCH_NPU_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def no_npu(clean_env: pytest.MonkeyPatch) -> None:
    """torch_npu not installed (a None entry in sys.modules makes `import torch_npu` fail)."""
    clean_env.setitem(sys.modules, "torch_npu", None)


@pytest.fixture
def fake_npu(clean_env: pytest.MonkeyPatch) -> FakeNpu:
    """A FAKE torch_npu (see module docstring) with 16 visible NPUs."""
    state = FakeNpu()
    state.rng_states = [torch.full((8,), i, dtype=torch.uint8) for i in range(state.count)]
    module = state.build()
    clean_env.setitem(sys.modules, "torch_npu", module)
    clean_env.setattr(torch, "npu", module.npu, raising=False)
    return state


@pytest.fixture
def restore_cuda_allocator_settings():
    """Tests that switch the real (process-global) allocator config put it back afterwards."""
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # held: tests may patch it away
    before = getter() if getter is not None else ""
    yield
    if setter is not None:
        setter(before or "expandable_segments:False")
