"""Loss scaling across gradient accumulation and data parallelism: splitting a mini-batch over DP
ranks and micro-batches (uneven sizes, each trimmed to its own padded length), summing micro-batch
losses on a rank and averaging gradients over ranks (what DDP/FSDP do) must reproduce the loss
and gradient of the whole mini-batch. Ranks are simulated in one process: the averaging is the
all-reduce, nothing else is faked."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.algo import grpo_math as gm

B, T, D = 9, 8, 4
# rank -> micro-batches as row ranges; rank 0 holds 5 rows (3 + 2), rank 1 holds 4 (1 + 3)
SPLITS = [[range(0, 3), range(3, 5)], [range(5, 6), range(6, 9)]]


def make_batch():
    g = torch.Generator().manual_seed(11)
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    ref = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.tensor([8, 3, 5, 1, 7, 2, 6, 4, 8])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    mask[3] = 0.0  # an empty response
    return feats, old, ref, adv, mask


def total_loss(w, feats, old, ref, adv, mask, mode, **scale):
    log_probs = -torch.nn.functional.softplus(feats @ w)  # a differentiable "policy"
    pg, _ = gm.policy_loss(
        log_probs, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.3, loss_agg_mode=mode, **scale
    )
    kl = gm.kl_loss(log_probs, ref, mask, kind="k3+", loss_agg_mode=mode, **scale)
    return pg + 0.1 * kl


@pytest.mark.parametrize("mode", gm.LOSS_AGG_MODES)
def test_microbatch_and_dp_split_equals_full_batch(mode):
    feats, old, ref, adv, mask = make_batch()
    w = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)

    full = total_loss(w, feats, old, ref, adv, mask, mode, loss_scale_factor=T)
    (full_grad,) = torch.autograd.grad(full, w)

    shards = [[rows for rows in rank] for rank in SPLITS]
    counts = [gm.loss_denominators(mask[list(rows)]) for rank in shards for rows in rank]
    tokens, seqs = sum(c[0] for c in counts), sum(c[1] for c in counts)  # the all-reduced sizes
    dp = len(shards)
    rank_grads, rank_values, naive_grads = [], [], []
    for rank in shards:
        grad = torch.zeros_like(w)
        naive = torch.zeros_like(w)
        value = 0.0
        for rows in rank:
            idx = list(rows)
            width = int(mask[idx].sum(-1).max().clamp(min=1))  # trim padding per micro-batch
            parts = (feats[idx, :width], old[idx, :width], ref[idx, :width], adv[idx], mask[idx, :width])
            loss = total_loss(
                w,
                *parts,
                mode,
                global_batch_tokens=tokens,
                global_batch_seqs=seqs,
                dp_size=dp,
                loss_scale_factor=T,
            )
            grad += torch.autograd.grad(loss, w)[0]
            value += loss.item()
            naive += torch.autograd.grad(total_loss(w, *parts, mode, loss_scale_factor=T), w)[0] / len(rank)
        rank_grads.append(grad)
        rank_values.append(value)
        naive_grads.append(naive)

    torch.testing.assert_close(torch.stack(rank_grads).mean(0), full_grad, rtol=0, atol=1e-12)
    assert sum(rank_values) / dp == pytest.approx(full.item(), abs=1e-12)
    # local means per micro-batch (the usual mistake) do not give the full-batch gradient here
    assert not torch.allclose(torch.stack(naive_grads).mean(0), full_grad, atol=1e-6)


def test_single_shard_with_global_sizes_equals_local_default():
    feats, old, ref, adv, mask = make_batch()
    w = torch.ones(D, dtype=torch.float64)
    tokens, seqs = gm.loss_denominators(mask)
    for mode in gm.LOSS_AGG_MODES:
        local = total_loss(w, feats, old, ref, adv, mask, mode)
        explicit = total_loss(
            w, feats, old, ref, adv, mask, mode, global_batch_tokens=tokens, global_batch_seqs=seqs
        )
        assert local.item() == pytest.approx(explicit.item(), abs=1e-12), mode
