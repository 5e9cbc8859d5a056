"""What the accelerator holds while the colocated rollout engine generates, and the allocator mode
around it.

- Offload (`actor.megatron.param_offload` / `grad_offload` / `optimizer_offload`, on the torch
  backend `actor.torch.param_offload` / `optimizer_offload`): the policy's weights, gradients and
  optimizer state leave the device before the engine wakes and come back after it sleeps, so the
  engine's weights and KV cache fit beside the actor.
- Expandable segments (`device.expandable_segments`): set when the worker starts; with vLLM they
  are off while the engine is awake (its sleep-mode allocator maps memory itself and does not work
  with them) and back on for training, as verl does.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

import grpo_device
from grpo_config.schema import ActorConfig, TrainerConfig
from grpo_device import DeviceKind
from grpo_trainer.protocols import PolicyBackend

log = structlog.get_logger()


@dataclass(frozen=True, kw_only=True)
class OffloadPlan:
    weights: bool = False
    grads: bool = False
    optimizer: bool = False

    @classmethod
    def for_actor(cls, actor: ActorConfig) -> OffloadPlan:
        """The offload settings of the actor's backend (grpo_config refuses the other backend's).
        The torch backend's weights move with their gradients (`Module.to`)."""
        if actor.backend == "torch":
            t = actor.torch
            return cls(weights=t.param_offload, grads=t.param_offload, optimizer=t.optimizer_offload)
        m = actor.megatron
        return cls(weights=m.param_offload, grads=m.grad_offload, optimizer=m.optimizer_offload)

    @property
    def any(self) -> bool:
        return self.weights or self.grads or self.optimizer


class RolloutMemory:
    """`plan`: what leaves the device; `expandable_segments` (`device.expandable_segments`) are
    turned off around the rollout when `engine_maps_memory` (vLLM's sleep-mode allocator)."""

    def __init__(
        self,
        backend: PolicyBackend,
        *,
        kind: DeviceKind,
        plan: OffloadPlan,
        expandable_segments: bool,
        engine_maps_memory: bool,
    ) -> None:
        self.backend = backend
        self.kind = kind
        self.plan = plan
        self.expandable = expandable_segments
        self.toggle = expandable_segments and engine_maps_memory

    @classmethod
    def for_config(cls, cfg: TrainerConfig, backend: PolicyBackend, *, kind: DeviceKind) -> RolloutMemory:
        """The sections of the root config this reads (actor, device, rollout), picked once."""
        return cls(
            backend,
            kind=kind,
            plan=OffloadPlan.for_actor(cfg.actor),
            expandable_segments=cfg.device.expandable_segments,
            engine_maps_memory=cfg.rollout.engine == "vllm",
        )

    @staticmethod
    def start(expandable_segments: bool, *, kind: DeviceKind) -> None:
        """The allocator mode for the whole run (`device.expandable_segments`), before the first
        large allocation."""
        applied = grpo_device.set_expandable_segments(expandable_segments, kind=kind)
        log.info(
            "rollout_memory.allocator",
            device=kind.value,
            expandable_segments=expandable_segments,
            applied=applied,
            read_back=grpo_device.read_expandable_segments(kind),
        )

    def before_rollout(self) -> None:
        if self.plan.any:
            self.backend.offload(weights=self.plan.weights, grads=self.plan.grads, optimizer=self.plan.optimizer)
        if self.toggle:
            grpo_device.set_expandable_segments(False, kind=self.kind)

    def after_rollout(self) -> None:
        if self.toggle:
            grpo_device.set_expandable_segments(True, kind=self.kind)
        if self.plan.any:
            self.backend.onload()
