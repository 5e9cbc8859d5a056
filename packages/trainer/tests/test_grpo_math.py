"""GRPO math against hand-computed cases and an independent reference written here from the
formulas with plain Python loops and numpy (it never calls grpo_math)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_trainer.algo import grpo_math as gm

# ---------------------------------------------------------------- reference implementation


def ref_group_adv(rewards, groups, norm_by_std=True, eps=1e-6):
    """verl's compute_grpo_outcome_advantage: a group of one has mean 0 and std 1."""
    out = []
    for i, g in enumerate(groups):
        members = [rewards[j] for j in range(len(groups)) if groups[j] == g]
        if len(members) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(members) / len(members)
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
        out.append((rewards[i] - mean) / (std + eps) if norm_by_std else rewards[i] - mean)
    return out


def ref_token_losses(lp, old, adv, mask, lo, hi, c):
    """Per-token dual-clip PPO loss and the three metrics, element by element."""
    B, T = lp.shape
    loss = np.zeros((B, T))
    clipped_n = lower_n = kl_sum = 0.0
    n = 0
    for b in range(B):
        for t in range(T):
            a = adv[b, t]
            lr = min(max(lp[b, t] - old[b, t], -20.0), 20.0)
            r = math.exp(lr)
            l1 = -a * r
            l2 = -a * min(max(r, 1 - lo), 1 + hi)
            lclip = max(l1, l2)
            tok = min(lclip, -a * c) if a < 0 else lclip
            loss[b, t] = tok
            if mask[b, t]:
                n += 1
                clipped_n += l2 > l1
                lower_n += (a < 0) and (lclip > -a * c)
                kl_sum += -lr
    return loss, {"pg_clipfrac": clipped_n / n, "pg_clipfrac_lower": lower_n / n, "ppo_kl": kl_sum / n}


def ref_agg(loss, mask, mode):
    B, T = loss.shape
    if mode == "token-mean":
        return sum(loss[b, t] for b in range(B) for t in range(T) if mask[b, t]) / mask.sum()
    seq_vals = []
    for b in range(B):
        toks = [loss[b, t] for t in range(T) if mask[b, t]]
        if not toks:
            continue
        seq_vals.append(sum(toks) / len(toks) if mode == "seq-mean-token-mean" else sum(toks))
    out = sum(seq_vals) / len(seq_vals)
    return out / T if mode == "seq-mean-token-sum-norm" else out


def ref_kl(lp, ref, kind):
    d = lp - ref
    if kind == "k1":
        return d
    if kind == "abs":
        return abs(d)
    if kind == "k2":
        return 0.5 * d * d
    x = min(max(ref - lp, -20.0), 20.0)
    return min(max(math.exp(x) - x - 1, -10.0), 10.0)


def ref_entropy(row):
    m = max(row)
    z = sum(math.exp(v - m) for v in row)
    return -sum((math.exp(v - m) / z) * ((v - m) - math.log(z)) for v in row)


# ---------------------------------------------------------------- fixtures


def random_batch(seed, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    # ratios in [0.22, 4.5]: the PPO clip and the dual clip are both hit
    old = lp + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 3.0
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    mask[0] = 0.0  # a fully masked sequence must not count in the seq-mean modes
    return lp, old, adv, mask


# ---------------------------------------------------------------- group advantages


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0])
    adv = gm.group_advantages(rewards, ["a", "a", "a", "a", "b"])
    # group a: mean 0.25, unbiased std sqrt(0.75/3) = 0.5
    # group b, one response: mean 0, std 1 as verl (5 / (1 + 1e-6))
    expected = torch.tensor([0.75 / 0.5, -0.25 / 0.5, -0.5, -0.5, 5.0 / (1 + 1e-6)])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    raw = gm.group_advantages(rewards, ["a", "a", "a", "a", "b"], norm_by_std=False)
    torch.testing.assert_close(raw, torch.tensor([0.75, -0.25, -0.25, -0.25, 5.0]))


def test_group_advantages_equal_rewards_give_zero_and_eps_guards():
    adv = gm.group_advantages(torch.tensor([1.0, 1.0, 1.0]), [7, 7, 7])
    assert torch.equal(adv, torch.zeros(3))


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_match_reference(seed, norm):
    rng = np.random.default_rng(seed)
    groups = [int(g) for g in rng.integers(0, 5, size=23)]
    rewards = rng.random(23).round(1)  # ties within groups happen
    got = gm.group_advantages(torch.tensor(rewards, dtype=torch.float64), groups, norm_by_std=norm)
    np.testing.assert_allclose(got.numpy(), ref_group_adv(list(rewards), groups, norm), atol=1e-6)


def ref_rloo_adv(rewards, groups):
    """verl's compute_rloo_outcome_advantage, written out: n > 1: r * n/(n-1) - mean * n/(n-1)."""
    out = []
    for i, g in enumerate(groups):
        members = [rewards[j] for j in range(len(groups)) if groups[j] == g]
        n = len(members)
        mean = sum(members) / n
        out.append(rewards[i] * n / (n - 1) - mean * n / (n - 1) if n > 1 else rewards[i])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_advantages_match_verl(seed):
    rng = np.random.default_rng(seed)
    groups = [int(g) for g in rng.integers(0, 6, size=29)]  # some groups of one
    rewards = rng.random(29)
    got = gm.rloo_advantages(torch.tensor(rewards, dtype=torch.float64), groups)
    np.testing.assert_allclose(got.numpy(), ref_rloo_adv(list(rewards), groups), atol=1e-12)


def test_rloo_hand_computed():
    # group a: [1, 0, 0, 0]: 1 - 0 = 1 and 0 - 1/3; group b of one keeps its 5
    got = gm.rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0]), ["a", "a", "a", "a", "b"])
    torch.testing.assert_close(got, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 5.0]))


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="group ids"):
        gm.group_advantages(torch.zeros(3), [0, 1])
    with pytest.raises(ValueError, match="1-D"):
        gm.group_advantages(torch.zeros(3, 2), [0, 1, 2])


# ---------------------------------------------------------------- masked helpers


def test_masked_mean_and_sum_ignore_masked_inf():
    x = torch.tensor([[1.0, 2.0, -math.inf], [4.0, math.nan, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert gm.masked_sum(x, m).item() == 13.0
    assert gm.masked_mean(x, m).item() == 13.0 / 4
    torch.testing.assert_close(gm.masked_mean(x, m, dim=-1), torch.tensor([1.5, 5.0]))
    assert gm.masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert gm.loss_denominators(torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 0]])) == (3, 2)


# ---------------------------------------------------------------- policy loss


def test_policy_loss_hand_computed_single_tokens():
    # ratio e^0.5 = 1.6487 with A=+1: clipped at 1.2 -> loss -1.2, clipfrac 1.
    # ratio e^2 = 7.389 with A=-1: PPO loss max(7.389, 1.2), dual clip bounds it at c=3 -> loss 3.
    # ratio 1 with A=+2: loss -2, no clipping.
    lp = torch.tensor([[0.5], [2.0], [0.0]])
    old = torch.zeros(3, 1)
    adv = torch.tensor([1.0, -1.0, 2.0])
    mask = torch.ones(3, 1)
    loss, met = gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((-1.2 + 3.0 - 2.0) / 3, abs=1e-6)
    # only token 0 takes the clipped branch: for A<0 and a large ratio max() keeps the unclipped 7.389
    assert met["pg_clipfrac"].item() == pytest.approx(1 / 3)
    assert met["pg_clipfrac_lower"].item() == pytest.approx(1 / 3)
    assert met["ppo_kl"].item() == pytest.approx(-(0.5 + 2.0) / 3)


def test_policy_loss_log_ratio_clamp():
    lp = torch.tensor([[100.0]])
    loss, met = gm.policy_loss(
        lp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_ratio_low=0.2, clip_ratio_high=10.0
    )
    assert math.isfinite(loss.item())
    assert loss.item() == pytest.approx(-11.0)
    assert met["ppo_kl"].item() == pytest.approx(-20.0)


@pytest.mark.parametrize("mode", gm.LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_policy_loss_matches_reference(mode, seed):
    lp, old, adv, mask = random_batch(seed)
    lo, hi, c = 0.2, 0.28, 3.0
    loss, met = gm.policy_loss(
        lp, old, adv, mask, clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c, loss_agg_mode=mode
    )
    adv2d = np.repeat(adv.numpy()[:, None], lp.shape[1], axis=1)
    ref_l, ref_m = ref_token_losses(lp.numpy(), old.numpy(), adv2d, mask.numpy(), lo, hi, c)
    assert loss.item() == pytest.approx(ref_agg(ref_l, mask.numpy(), mode), abs=1e-6)
    for key, value in ref_m.items():
        assert met[key].item() == pytest.approx(value, abs=1e-6), key
    assert ref_m["pg_clipfrac"] > 0 and ref_m["pg_clipfrac_lower"] > 0  # the batch exercises both clips


def test_policy_loss_accepts_token_level_advantages():
    lp, old, adv, mask = random_batch(5)
    adv2d = adv[:, None].expand_as(lp).clone()
    a, _ = gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    b, _ = gm.policy_loss(lp, old, adv2d, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert a.item() == b.item()


def test_policy_loss_gradient_at_ratio_one_is_minus_advantage_over_tokens():
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = gm.policy_loss(
        lp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    loss.backward()
    expected = -torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]]) / 5
    torch.testing.assert_close(lp.grad, expected)


def test_policy_loss_validates_arguments():
    lp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="mean")
    with pytest.raises(ValueError, match="advantages"):
        gm.policy_loss(lp, old, adv[:, None].repeat(1, 2), mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    with pytest.raises(ValueError, match="global_batch_tokens is required"):
        gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, dp_size=2)
    with pytest.raises(ValueError, match="global_batch_seqs is required"):
        gm.aggregate_loss(lp, mask, "seq-mean-token-sum", dp_size=2, global_batch_tokens=5)


# ---------------------------------------------------------------- aggregation


def test_aggregate_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert gm.aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert gm.aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert gm.aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert gm.aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 4) / 2 / 3)
    assert gm.aggregate_loss(
        loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10
    ).item() == pytest.approx(0.5)


# ---------------------------------------------------------------- KL and entropy


VERL_KL_NAMES = ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]


@pytest.mark.parametrize("kind", [*VERL_KL_NAMES, *(f"{k}+" for k in VERL_KL_NAMES)])
def test_kl_penalty_matches_reference(kind):
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 4
    lp[0, 0], ref[0, 0] = -30.0, 0.0  # k3 clamps: exp(30) would explode
    got = gm.kl_penalty(lp, ref, kind)
    base = {"low_var_kl": "k3", "kl": "k1", "mse": "k2"}.get(kind.removesuffix("+"), kind.removesuffix("+"))
    expected = [[ref_kl(lp[b, t].item(), ref[b, t].item(), base) for t in range(6)] for b in range(5)]
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    if base == "k3":
        assert got[0, 0].item() == 10.0


def test_k3_hand_computed():
    # logp = 0, ref = log 2: exp(log 2) - log 2 - 1 = 1 - log 2
    val = gm.kl_penalty(torch.tensor([0.0]), torch.tensor([math.log(2)]), "k3")
    assert val.item() == pytest.approx(1 - math.log(2))


def test_k3_plus_has_k3_value_and_k2_gradient():
    g = torch.Generator().manual_seed(4)
    ref = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    base = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    lp_plus = base.clone().requires_grad_(True)
    lp_k2 = base.clone().requires_grad_(True)
    lp_k3 = base.clone().requires_grad_(True)
    v_plus = gm.kl_penalty(lp_plus, ref, "k3+")
    v_plus.sum().backward()
    gm.kl_penalty(lp_k2, ref, "k2").sum().backward()
    v_k3 = gm.kl_penalty(lp_k3, ref, "k3")
    v_k3.sum().backward()
    torch.testing.assert_close(v_plus.detach(), v_k3.detach())
    torch.testing.assert_close(lp_plus.grad, lp_k2.grad)
    torch.testing.assert_close(lp_plus.grad, base - ref)  # d/dx 0.5 x^2
    assert not torch.allclose(lp_plus.grad, lp_k3.grad)


@pytest.mark.parametrize("kind", [f"{k}+" for k in VERL_KL_NAMES])
def test_every_plus_form_has_its_value_and_k2_s_gradient(kind):
    """verl's straight-through rule for each estimator: the value of `kind` without '+', the
    gradient of k2 = 0.5 * (logp - ref)^2, i.e. logp - ref."""
    g = torch.Generator().manual_seed(6)
    ref = -torch.rand(3, 4, generator=g, dtype=torch.float64) * 2
    lp = (-torch.rand(3, 4, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    value = gm.kl_penalty(lp, ref, kind)
    value.sum().backward()
    torch.testing.assert_close(value.detach(), gm.kl_penalty(lp.detach(), ref, kind.removesuffix("+")))
    torch.testing.assert_close(lp.grad, lp.detach() - ref)


def test_kl_loss_aggregates_and_rejects_unknown_kind():
    lp = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    ref = torch.zeros(2, 2)
    mask = torch.tensor([[1, 1], [1, 0]])
    assert gm.kl_loss(lp, ref, mask, kind="k1").item() == pytest.approx(1.0)
    assert gm.kl_loss(lp, ref, mask, kind="k2", loss_agg_mode="seq-mean-token-sum").item() == pytest.approx(
        (0.5 + 2.0) / 2
    )
    with pytest.raises(ValueError, match="unknown KL estimator"):
        gm.kl_penalty(lp, ref, "k4")


def test_entropy_matches_reference_and_handles_masked_vocab():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 4, 11, generator=g, dtype=torch.float64) * 5
    got = gm.entropy_from_logits(logits)
    expected = [[ref_entropy(logits[b, t].tolist()) for t in range(4)] for b in range(3)]
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    assert gm.entropy_from_logits(torch.zeros(8)).item() == pytest.approx(math.log(8))
    big = torch.tensor([1e4, 0.0, -1e4])  # naive softmax-then-log would overflow or give nan
    assert gm.entropy_from_logits(big).item() == pytest.approx(0.0, abs=1e-6)
    masked = torch.tensor([0.0, 0.0, -math.inf])
    assert gm.entropy_from_logits(masked).item() == pytest.approx(math.log(2))


def test_public_api_is_frozen():
    assert gm.__all__ == [
        "KL_KINDS",
        "LOSS_AGG_MODES",
        "POLICY_LOSS_MODES",
        "aggregate_loss",
        "entropy_from_logits",
        "group_advantages",
        "kl_loss",
        "kl_penalty",
        "loss_denominators",
        "masked_mean",
        "masked_sum",
        "policy_loss",
        "rloo_advantages",
    ]
