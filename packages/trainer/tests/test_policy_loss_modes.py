"""GSPO, CISPO and truncated importance weights in the policy loss, against references written here
from verl's definitions (core_algos `compute_policy_loss_gspo` / `_cispo`, the `rollout_is_weights`
factor), element by element in float64: values and gradients at 1e-6 (1e-9 where exact)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_trainer.algo import grpo_math as gm


def _inputs(seed: int, rows: int = 5, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.rand(rows, width, generator=g, dtype=torch.float64) * -3).requires_grad_(True)
    old = lp.detach() + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.15
    mask = torch.ones(rows, width, dtype=torch.float64)
    for i in range(rows):
        mask[i, 1 + i % (width - 1) :] = 0  # rows of different lengths
    mask[0, 0] = 0
    mask[0, 1] = 1
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    return lp, old, mask, adv


def _rows(mask):
    return [[t for t in range(mask.shape[1]) if mask[i, t] > 0] for i in range(mask.shape[0])]


def _gspo_reference(lp, old, mask, adv_tok, low, high):
    """Sequence-level GSPO as the paper writes it, per sequence, with autograd through
    s_i = exp(mean_t(log pi - log pi_old)); each token takes its own advantage (GSPO-token)."""
    total = 0
    rows = _rows(mask)
    for i, tokens in enumerate(rows):
        mean_log = sum(lp[i, t] - old[i, t] for t in tokens) / len(tokens)
        seq_terms = 0
        for t in tokens:
            # GSPO-token: s_i,t = sg[s_i] * pi_t / sg[pi_t]
            s = torch.exp(mean_log.detach() + lp[i, t] - lp[i, t].detach())
            a = adv_tok[i, t]
            seq_terms = seq_terms + torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high))
        total = total + seq_terms / len(tokens)
    return total / len(rows)


def _gspo_sequence_level(lp, old, mask, adv, low, high):
    """GSPO's sequence objective: min(s_i A_i, clip(s_i) A_i), averaged over sequences, with the
    gradient through the sequence ratio itself (no token-level construction)."""
    total = 0
    rows = _rows(mask)
    for i, tokens in enumerate(rows):
        s = torch.exp(sum(lp[i, t] - old[i, t] for t in tokens) / len(tokens))
        total = total + torch.maximum(-adv[i] * s, -adv[i] * torch.clamp(s, 1 - low, 1 + high))
    return total / len(rows)


@pytest.mark.parametrize("low,high", [(3e-4, 4e-4), (0.2, 0.28)])
def test_gspo_equals_sequence_level_gspo_for_sequence_advantages(low, high) -> None:
    lp, old, mask, adv = _inputs(0)
    loss, metrics = gm.policy_loss(
        lp, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high, loss_mode="gspo", loss_agg_mode="seq-mean-token-mean"
    )
    (grad,) = torch.autograd.grad(loss, lp)
    lp_ref = lp.detach().clone().requires_grad_(True)
    expected = _gspo_sequence_level(lp_ref, old, mask, adv, low, high)
    (grad_ref,) = torch.autograd.grad(expected, lp_ref)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-9)
    np.testing.assert_allclose(grad.numpy(), grad_ref.numpy(), atol=1e-9)
    assert grad.abs().sum() > 0
    # Clip fraction: tokens of the sequences whose ratio left [1 - low, 1 + high] in the loss-increasing direction.
    rows = _rows(mask)
    clipped = n = 0
    for i, tokens in enumerate(rows):
        s = math.exp(sum(float(lp[i, t] - old[i, t]) for t in tokens) / len(tokens))
        a = float(adv[i])
        hit = -a * min(max(s, 1 - low), 1 + high) > -a * s
        clipped += hit * len(tokens)
        n += len(tokens)
    assert metrics["pg_clipfrac"].item() == pytest.approx(clipped / n, abs=1e-12)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    ppo_kl = sum(float(old[i, t] - lp[i, t]) for i, tokens in enumerate(rows) for t in tokens) / n
    assert metrics["ppo_kl"].item() == pytest.approx(ppo_kl, abs=1e-12)


def test_gspo_token_variant_with_per_token_advantages() -> None:
    lp, old, mask, _ = _inputs(1)
    adv_tok = torch.randn(lp.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    loss, _ = gm.policy_loss(
        lp, old, adv_tok, mask, clip_ratio_low=0.05, clip_ratio_high=0.05, loss_mode="gspo", loss_agg_mode="seq-mean-token-mean"
    )
    (grad,) = torch.autograd.grad(loss, lp)
    lp_ref = lp.detach().clone().requires_grad_(True)
    expected = _gspo_reference(lp_ref, old, mask, adv_tok, 0.05, 0.05)
    (grad_ref,) = torch.autograd.grad(expected, lp_ref)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-9)
    np.testing.assert_allclose(grad.numpy(), grad_ref.numpy(), atol=1e-9)


def test_gspo_refuses_other_aggregations() -> None:
    lp, old, mask, adv = _inputs(2)
    with pytest.raises(ValueError, match="sequence mean of token means"):
        gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, loss_mode="gspo")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_cispo_weights_each_token_gradient_by_the_clipped_ratio(agg) -> None:
    lp, old, mask, adv = _inputs(3)
    low, high = 10.0, 0.05  # verl's example: no lower bound, a tight upper one
    loss, metrics = gm.policy_loss(
        lp, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high, loss_mode="cispo", loss_agg_mode=agg
    )
    (grad,) = torch.autograd.grad(loss, lp)
    rows = _rows(mask)
    n_tokens = sum(len(t) for t in rows)
    value = 0.0
    expected_grad = np.zeros(lp.shape)
    outside = 0
    for i, tokens in enumerate(rows):
        denom = n_tokens if agg == "token-mean" else len(rows)
        for t in tokens:
            r = math.exp(float(lp[i, t] - old[i, t]))
            rc = min(max(r, 1 - low), 1 + high)
            outside += rc != r
            value += -rc * float(adv[i]) * float(lp[i, t]) / denom
            expected_grad[i, t] = -rc * float(adv[i]) / denom
    assert loss.item() == pytest.approx(value, abs=1e-9)
    np.testing.assert_allclose(grad.numpy(), expected_grad, atol=1e-9)
    assert outside > 0  # the upper clip was exercised
    assert metrics["pg_clipfrac"].item() == pytest.approx(outside / n_tokens, abs=1e-12)
    assert metrics["pg_clipfrac_lower"].item() == 0.0


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "cispo"])
def test_importance_weights_multiply_each_token_loss_after_the_clip(mode) -> None:
    lp, old, mask, adv = _inputs(4)
    weights = torch.rand(lp.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2
    agg = "seq-mean-token-mean" if mode == "gspo" else "token-mean"
    kwargs = {"clip_ratio_low": 0.1, "clip_ratio_high": 0.1, "loss_mode": mode, "loss_agg_mode": agg}
    weighted, _ = gm.policy_loss(lp, old, adv, mask, is_weights=weights, **kwargs)
    (grad_w,) = torch.autograd.grad(weighted, lp)
    # Reference: each token's unweighted loss written out, times its weight, aggregated here.
    rows = _rows(mask)
    n_tokens = sum(len(t) for t in rows)
    total = 0.0
    expected_grad = torch.zeros_like(lp)
    for i, tokens in enumerate(rows):
        for t in tokens:
            lp_ref = lp.detach().clone().requires_grad_(True)
            token_loss = _token_loss(lp_ref, old, adv, mask, i, t, mode)
            scale = weights[i, t].item() / (len(tokens) * len(rows) if mode == "gspo" else n_tokens)
            total += token_loss.item() * scale
            (g,) = torch.autograd.grad(token_loss, lp_ref)
            expected_grad += g * scale
    assert weighted.item() == pytest.approx(total, abs=1e-9)
    np.testing.assert_allclose(grad_w.numpy(), expected_grad.numpy(), atol=1e-9)


def _token_loss(lp, old, adv, mask, i, t, mode):
    """Token (i, t)'s loss under verl's definition, written out (its gradient flows to lp[i, t] only)."""
    a = adv[i]
    if mode == "vanilla":
        r = torch.exp(lp[i, t] - old[i, t])
        clip = torch.maximum(-a * r, -a * torch.clamp(r, 0.9, 1.1))
        return torch.minimum(clip, -a * 3.0) if a < 0 else clip
    if mode == "gspo":
        tokens = [u for u in range(mask.shape[1]) if mask[i, u] > 0]
        mean_log = sum(float(lp[i, u] - old[i, u]) for u in tokens) / len(tokens)
        s = torch.exp(mean_log + lp[i, t] - lp[i, t].detach())
        return torch.maximum(-a * s, -a * torch.clamp(s, 0.9, 1.1))
    r = math.exp(float(lp[i, t] - old[i, t]))
    return -min(max(r, 0.9), 1.1) * a * lp[i, t]


def test_unknown_loss_mode_is_refused_with_the_list() -> None:
    lp, old, mask, adv = _inputs(5)
    with pytest.raises(ValueError, match=r"unknown policy loss mode 'sapo'.*vanilla"):
        gm.policy_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, loss_mode="sapo")
