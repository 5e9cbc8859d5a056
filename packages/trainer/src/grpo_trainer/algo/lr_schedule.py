"""The learning-rate schedule every backend steps with: linear warmup over `actor.lr_warmup_steps`
training steps to `actor.lr`, then constant. As verl's scheduler, it advances once per training step
(one `Actor.update`, whatever its number of mini-batches and PPO epochs), and only when that step
took at least one optimizer step (steps skipped for non-finite gradients do not advance it)."""

from __future__ import annotations

from typing import Any


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
