"""What leaves the device around a colocated rollout, and the allocator mode, in order.

The CUDA allocator and a Megatron policy cannot exist on this machine: a recording stand-in takes
the Megatron backend's offload primitives and `grpo_device.set_expandable_segments` is recorded
(the real CUDA read-back and the memory freed are measured on the H200: docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

import grpo_config
import grpo_device
from grpo_device import DeviceKind
from grpo_trainer.workers.rollout_memory import OffloadPlan, RolloutMemory

MEGATRON = ["actor.backend=megatron", "rollout.engine=vllm"]


class Recording:
    def __init__(self, events: list) -> None:
        self.events = events

    def offload(self, *, weights: bool, grads: bool, optimizer: bool) -> None:
        self.events.append(("offload", weights, grads, optimizer))

    def onload(self) -> None:
        self.events.append(("onload",))


@pytest.fixture
def events(monkeypatch) -> list:
    recorded: list = []
    monkeypatch.setattr(
        grpo_device, "set_expandable_segments", lambda enable, kind: recorded.append(("expandable", enable)) or True
    )
    return recorded


def _rollout(overrides: list[str], events: list) -> list:
    cfg = grpo_config.load(None, overrides)
    memory = RolloutMemory.for_config(cfg, Recording(events), kind=DeviceKind.CUDA)
    memory.before_rollout()
    events.append(("generate",))
    memory.after_rollout()
    return events


def test_offload_then_segments_off_for_vllm_and_back_in_reverse(events) -> None:
    overrides = [*MEGATRON, "actor.megatron.param_offload=true", "actor.megatron.grad_offload=true"]
    assert _rollout(overrides, events) == [
        ("offload", True, True, False),
        ("expandable", False),
        ("generate",),
        ("expandable", True),
        ("onload",),
    ]


def test_each_offload_setting_moves_its_own_part(events) -> None:
    assert OffloadPlan.for_actor(grpo_config.load(None, [*MEGATRON, "actor.megatron.optimizer_offload=true"]).actor) == (
        OffloadPlan(optimizer=True)
    )
    assert _rollout([*MEGATRON, "actor.megatron.param_offload=true", "device.expandable_segments=false"], events) == [
        ("offload", True, False, False),
        ("generate",),
        ("onload",),
    ]


def test_nothing_moves_without_offload_settings_or_with_the_hf_engine(events) -> None:
    assert _rollout(MEGATRON, events) == [("expandable", False), ("generate",), ("expandable", True)]
    events.clear()
    # The hf engine generates with the policy's own module: no allocator switch, no offload.
    assert _rollout(["rollout.engine=hf"], events) == [("generate",)]


def test_the_run_starts_with_the_configured_allocator_mode() -> None:
    cfg = grpo_config.load(None, ["device.expandable_segments=true"])
    with capture_logs() as logs:
        RolloutMemory.start(cfg.device.expandable_segments, kind=DeviceKind.CPU)
    assert [e["event"] for e in logs] == ["expandable_segments_skipped", "rollout_memory.allocator"]
    assert logs[1]["expandable_segments"] is True and logs[1]["applied"] is False  # CPU: no such allocator


def test_the_torch_backend_offloads_its_weights_with_their_gradients(events) -> None:
    """`actor.torch.param_offload` / `optimizer_offload` (verl's fsdp_config keys): `Module.to`
    moves a module's gradients with its weights, so the one setting asks for both."""
    torch_vllm = ["rollout.engine=vllm", "device.expandable_segments=false"]
    assert OffloadPlan.for_actor(grpo_config.load(None, ["actor.torch.param_offload=true"]).actor) == OffloadPlan(
        weights=True, grads=True
    )
    assert _rollout([*torch_vllm, "actor.torch.optimizer_offload=true"], events) == [
        ("offload", False, False, True),
        ("generate",),
        ("onload",),
    ]
