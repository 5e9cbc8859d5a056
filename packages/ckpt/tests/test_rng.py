from __future__ import annotations

import importlib
import json
import random

import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from grpo_ckpt import capture_rng, restore_rng

rng_module = importlib.import_module("grpo_ckpt.rng")


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
    four RNG calls capture_rng/restore_rng make."""

    def __init__(self, count: int) -> None:
        self.states = [torch.full((8,), i, dtype=torch.uint8) for i in range(count)]

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self.states = [s.clone() for s in states]

    def device_count(self) -> int:
        return len(self.states)


def test_device_generators_restore_only_on_a_matching_device(monkeypatch: pytest.MonkeyPatch) -> None:
    device = FakeAccelerator(2)
    monkeypatch.setattr(rng_module, "_device_rng_module", lambda: ("cuda", device))
    state = capture_rng()
    assert state["device"]["kind"] == "cuda" and len(state["device"]["states"]) == 2

    device.states = [torch.zeros(8, dtype=torch.uint8)] * 2
    restore_rng(state)
    assert [int(s[0]) for s in device.states] == [0, 1]

    monkeypatch.setattr(rng_module, "_device_rng_module", lambda: ("cuda", FakeAccelerator(4)))
    with capture_logs() as logs:
        restore_rng(state)
    assert logs[0]["event"] == "ckpt.rng_device_skipped" and logs[0]["current_devices"] == 4

    monkeypatch.setattr(rng_module, "_device_rng_module", lambda: None)
    with capture_logs() as logs:
        restore_rng(state)
    assert logs[0]["saved_kind"] == "cuda" and logs[0]["current_kind"] is None
