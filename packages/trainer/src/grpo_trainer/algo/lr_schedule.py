"""The learning-rate schedule every backend steps with: linear warmup over `actor.lr_warmup_steps`
training steps (or `actor.lr_warmup_steps_ratio` of the run's) to `actor.lr`, then constant. As verl's scheduler, it advances once per training step
(one `Actor.update`, whatever its number of mini-batches and PPO epochs), and only when that step
took at least one optimizer step (steps skipped for non-finite gradients do not advance it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from grpo_config.schema import TrainerConfig

log = structlog.get_logger()


def with_warmup_steps(cfg: TrainerConfig, total_steps: int) -> TrainerConfig:
    """`cfg` with verl's `actor.lr_warmup_steps_ratio` turned into `actor.lr_warmup_steps` for a
    run of `total_steps` training steps (int(), as verl rounds); unchanged without a ratio."""
    ratio = cfg.actor.lr_warmup_steps_ratio
    if not ratio:
        return cfg
    steps = int(ratio * total_steps)
    log.info("lr_schedule.warmup_from_ratio", ratio=ratio, total_steps=total_steps, warmup_steps=steps)
    actor = dataclasses.replace(cfg.actor, lr_warmup_steps=steps, lr_warmup_steps_ratio=0.0)
    return dataclasses.replace(cfg, actor=actor)


class LRSchedule:
    def __init__(self, *, lr: float, warmup_steps: int) -> None:
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        self.base_lr = lr
        self.warmup_steps = max(warmup_steps, 0)
        self.steps_done = 0

    @property
    def lr(self) -> float:
        """The rate of the next optimizer step."""
        if not self.warmup_steps:
            return self.base_lr
        return self.base_lr * min(1.0, (self.steps_done + 1) / self.warmup_steps)

    def step(self) -> None:
        self.steps_done += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # "last_epoch": torch LambdaLR's count, in checkpoints of the torch backend before this schedule.
        self.steps_done = int(state["steps_done"] if "steps_done" in state else state["last_epoch"])
