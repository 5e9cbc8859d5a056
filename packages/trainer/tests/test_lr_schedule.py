"""The one learning-rate schedule: linear warmup then constant; its state, old checkpoints included."""

from __future__ import annotations

import pytest

from grpo_trainer.algo.lr_schedule import LRSchedule


def test_linear_warmup_then_constant_and_state_round_trip() -> None:
    schedule = LRSchedule(lr=1e-3, warmup_steps=4)
    rates = []
    for _ in range(6):
        rates.append(schedule.lr)
        schedule.step()
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    again = LRSchedule(lr=1e-3, warmup_steps=4)
    again.load_state_dict(LRSchedule(lr=1e-3, warmup_steps=4).state_dict() | {"steps_done": 2})
    assert again.lr == pytest.approx(7.5e-4)
    assert LRSchedule(lr=2e-6, warmup_steps=0).lr == 2e-6


def test_a_torch_lambdalr_state_from_an_older_checkpoint_resumes_at_its_step() -> None:
    schedule = LRSchedule(lr=1e-3, warmup_steps=4)
    schedule.load_state_dict({"last_epoch": 3, "base_lrs": [1e-3], "_step_count": 4})
    assert schedule.steps_done == 3 and schedule.lr == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="learning rate must be >= 0"):
        LRSchedule(lr=-1.0, warmup_steps=0)
