from __future__ import annotations

import json
import random
import sys
import types

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from grpo_ckpt import capture_rng, restore_rng


def test_state_is_plain_json_and_restores_every_cpu_generator() -> None:
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    np.random.standard_normal()  # leave a cached gaussian in numpy's state
    state = json.loads(json.dumps(capture_rng()))
    expected = (random.random(), np.random.standard_normal(), torch.randn(3))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    restore_rng(state)
    assert (random.random(), np.random.standard_normal()) == expected[:2]
    assert torch.equal(torch.randn(3), expected[2])


class FakeAccelerator:
    """Stands in for torch.cuda / torch.npu, which cannot exist on this CPU-only machine: just the
    three RNG calls grpo_device makes for capture_rng/restore_rng. For "npu" it is installed as a
    FAKE `torch_npu` module (sys.modules) whose `npu` attribute is this object, as torch_npu's is."""

    def __init__(self, count: int) -> None:
        self.states = [torch.full((8,), i, dtype=torch.uint8) for i in range(count)]

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self.states = [s.clone() for s in states]

    def device_count(self) -> int:
        return len(self.states)

    def is_available(self) -> bool:
        return True


def _install(monkeypatch: pytest.MonkeyPatch, kind: str, device: FakeAccelerator) -> None:
    monkeypatch.delenv("DEVICE", raising=False)
    if kind == "cuda":
        for name in ("get_rng_state_all", "set_rng_state_all", "device_count", "is_available"):
            monkeypatch.setattr(torch.cuda, name, getattr(device, name))
    else:
        monkeypatch.setitem(sys.modules, "torch_npu", types.SimpleNamespace(npu=device))
        monkeypatch.setattr(torch, "npu", device, raising=False)


@pytest.mark.parametrize("kind", ["cuda", "npu"])
def test_device_generators_restore_only_on_a_matching_device(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    device = FakeAccelerator(2)
    _install(monkeypatch, kind, device)
    state = json.loads(json.dumps(capture_rng(kind=kind)))
    assert state["device"]["kind"] == kind and len(state["device"]["states"]) == 2

    device.states = [torch.zeros(8, dtype=torch.uint8)] * 2
    restore_rng(state, kind=kind)
    assert [int(s[0]) for s in device.states] == [0, 1]

    _install(monkeypatch, kind, FakeAccelerator(4))
    with capture_logs() as logs:
        restore_rng(state, kind=kind)
    assert logs[0]["event"] == "ckpt.rng_device_skipped" and logs[0]["current_devices"] == 4

    with capture_logs() as logs:
        restore_rng(state, kind="cpu")
    assert logs[0]["saved_kind"] == kind and logs[0]["current_kind"] is None

    other = "npu" if kind == "cuda" else "cuda"
    _install(monkeypatch, other, FakeAccelerator(2))
    with capture_logs() as logs:
        restore_rng(state, kind=other)
    assert (logs[0]["saved_kind"], logs[0]["current_kind"]) == (kind, other)


def test_kind_none_detects_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DEVICE and no accelerator here: the detected kind is cpu, so no device generators."""
    monkeypatch.delenv("DEVICE", raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert capture_rng()["device"] is None
    device = FakeAccelerator(1)
    _install(monkeypatch, "cuda", device)
    assert capture_rng()["device"]["kind"] == "cuda"
