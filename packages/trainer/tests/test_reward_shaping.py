"""DAPO's overlong penalty and group filter, and the KL penalty in the reward with its fixed and
adaptive controllers, against references written here from verl's definitions (DAPORewardManager,
the DAPO trainer's `filter_groups`, `apply_kl_penalty`, `AdaptiveKLController`), in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_config.schema import KLControlConfig
from grpo_trainer.algo.reward_shaping import KLController, kl_reward_penalty, overlong_penalty
from grpo_trainer.driver.sampling import groups_with_spread


def test_overlong_penalty_ramps_over_the_buffer() -> None:
    budget, buffer, factor = 20, 8, 1.5
    lengths = torch.arange(0, budget + 1)
    got = overlong_penalty(lengths, budget=budget, buffer_len=buffer, penalty_factor=factor)
    for length, value in zip(lengths.tolist(), got.tolist(), strict=True):
        expected_len = budget - buffer
        exceed = length - expected_len
        assert value == pytest.approx(min(-exceed / buffer * factor, 0.0), abs=1e-6)
    assert got[12].item() == 0.0 and got[-1].item() == pytest.approx(-factor)
    with pytest.raises(ValueError, match="between 1 and the budget"):
        overlong_penalty(lengths, budget=4, buffer_len=8, penalty_factor=1.0)


def test_groups_kept_are_those_with_spread_or_alone() -> None:
    values = [1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.7, 0.0, 0.0]
    groups = [0, 0, 1, 1, 2, 2, 3, 4, 4]
    # group 0 all equal (dropped), 1 mixed (kept), 2 equal (dropped), 3 alone (kept), 4 equal (dropped)
    assert groups_with_spread(values, groups) == [1, 3]


def test_fixed_controller_never_moves() -> None:
    ctrl = KLController(KLControlConfig(kl_coef=0.05))
    ctrl.update(10.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_adaptive_controller_follows_verl_update() -> None:
    cfg = KLControlConfig(type="adaptive", kl_coef=0.2, target_kl=0.05, horizon=500)
    ctrl = KLController(cfg)
    value = 0.2
    for current, n in [(0.01, 64), (0.049, 64), (0.2, 128), (0.06, 32)]:
        error = float(np.clip(current / 0.05 - 1, -0.2, 0.2))
        value *= 1 + error * n / 500
        ctrl.update(current, n_steps=n)
        assert ctrl.value == pytest.approx(value, rel=1e-12)
    restored = KLController(cfg)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value
    # A fixed coefficient is the setting's on resume; a switch of type starts from kl_coef.
    fixed = KLController(KLControlConfig(kl_coef=0.3))
    fixed.load_state_dict(ctrl.state_dict())
    assert fixed.value == 0.3
    switched = KLController(cfg)
    switched.load_state_dict({"type": "fixed", "value": 0.7})
    assert switched.value == 0.2


@pytest.mark.parametrize("kind", ["kl", "low_var_kl", "mse", "abs", "k3+"])
def test_kl_in_reward_subtracts_beta_times_the_token_kl_sum(kind) -> None:
    g = torch.Generator().manual_seed(0)
    old = torch.rand(4, 6, generator=g, dtype=torch.float64) * -3
    ref = old + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.3
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.float64)
    ctrl = KLController(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.01, horizon=100))
    penalty, metrics = kl_reward_penalty(old, ref, mask, kind=kind, controller=ctrl)
    base = kind.rstrip("+")
    per_token = {
        "kl": lambda a, b: a - b,
        "low_var_kl": lambda a, b: min(max(math.exp(b - a) - (b - a) - 1, -10), 10),
        "mse": lambda a, b: 0.5 * (a - b) ** 2,
        "abs": lambda a, b: abs(a - b),
        "k3": lambda a, b: min(max(math.exp(b - a) - (b - a) - 1, -10), 10),
    }[base]
    sums, means = [], []
    for i in range(4):
        values = [per_token(float(old[i, t]), float(ref[i, t])) for t in range(6) if mask[i, t]]
        sums.append(sum(values))
        means.append(sum(values) / len(values))
    np.testing.assert_allclose(penalty.numpy(), 0.1 * np.array(sums), atol=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1  # the coefficient before the update
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(np.mean(means), abs=1e-6)
    error = float(np.clip(np.mean(means) / 0.01 - 1, -0.2, 0.2))
    assert ctrl.value == pytest.approx(0.1 * (1 + error * 4 / 100), rel=1e-9)
