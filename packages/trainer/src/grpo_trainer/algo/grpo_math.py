"""GRPO math: group advantages, the PPO clipped policy loss, loss aggregation, KL estimators and
entropy. Pure torch, no I/O. Definitions follow verl's `core_algos` (noted where they differ).

The derivation: docs/INTERNALS.md, `grpo_trainer.algo.grpo_math`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch

__all__ = [
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

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# verl's names: `kl` is k1, `mse` is k2, `low_var_kl` is k3; each with `+` (straight-through).
_KL_BASE = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
KL_KINDS: tuple[str, ...] = (*_KL_BASE, *(f"{name}+" for name in _KL_BASE))
LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def _grouped(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> tuple[torch.Tensor, ...] | None:
    """(rewards as float64, each response's dense group index, responses per group), after the
    checks both advantage estimators need; None for no rewards."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if len(group_ids) != rewards.shape[0]:
        raise ValueError(
            f"got {len(group_ids)} group ids for {rewards.shape[0]} rewards; pass one id per response"
        )
    if rewards.numel() == 0:
        return None
    dense: dict[Hashable, int] = {}
    group = torch.tensor([dense.setdefault(g, len(dense)) for g in group_ids], device=rewards.device)
    r = rewards.detach().to(torch.float64)
    count = torch.zeros(len(dense), dtype=torch.float64, device=r.device).index_add_(0, group, torch.ones_like(r))
    return r, group, count


def group_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO outcome advantage per response: `(r - mean_g) / (std_g + eps)` over the responses of
    its group `g` (unbiased std), or `r - mean_g` when `norm_by_std` is false (Dr. GRPO).
    A group of one response takes mean 0 and std 1, as verl's `compute_grpo_outcome_advantage`
    does: its advantage is `r / (1 + eps)` (`r` without the std). Chosen for parity with verl's
    numbers; such a group carries no comparison, and `rollout.n >= 2` is required with GRPO."""
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    r, group, count = grouped
    several = count > 1
    mean = torch.zeros_like(count).index_add_(0, group, r) / count
    mean = torch.where(several, mean, torch.zeros_like(mean))
    centred = r - mean[group]
    if norm_by_std:
        sq = torch.zeros_like(count).index_add_(0, group, centred.square())
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        std = torch.where(several, std, torch.ones_like(std))
        centred = centred / (std[group] + eps)
    return centred.to(out_dtype)


def rloo_advantages(rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """RLOO's leave-one-out advantage (verl's `compute_rloo_outcome_advantage`): in a group of
    n > 1 responses, `r_i - mean of the other n - 1 rewards` (= n / (n - 1) * (r_i - mean_g)); a
    group of one keeps its reward."""
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    grouped = _grouped(rewards, group_ids)
    if grouped is None:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)
    r, group, count = grouped
    total = torch.zeros_like(count).index_add_(0, group, r)
    n = count[group]
    leave_one_out = (n * r - total[group]) / (n - 1).clamp(min=1)
    return torch.where(n > 1, leave_one_out, r).to(out_dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x * mask`; masked-out entries are ignored even when they are inf or NaN."""
    weights = mask.to(x.dtype)
    kept = torch.where(mask != 0, x, torch.zeros_like(x)) * weights
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over entries where `mask` is set; 0 where nothing is set."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1e-8)


def loss_denominators(response_mask: torch.Tensor) -> tuple[int, int]:
    """(response tokens, sequences with at least one response token) of one shard of a batch:
    add these up over micro-batches and ranks to get `global_batch_tokens` / `global_batch_seqs`."""
    tokens_per_seq = (response_mask != 0).sum(dim=-1)
    return int(tokens_per_seq.sum().item()), int((tokens_per_seq > 0).sum().item())


def _check_global(value: float | int | torch.Tensor | None, *, name: str, dp_size: int) -> None:
    if value is None:
        if dp_size > 1:
            raise ValueError(
                f"{name} is required when dp_size > 1 (dp_size={dp_size}); sum loss_denominators() over the mini-batch on every rank"
            )
        return
    if float(value) <= 0:
        raise ValueError(f"{name} must be positive, got {float(value)}")


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_batch_tokens: float | int | torch.Tensor | None = None,
    global_batch_seqs: float | int | torch.Tensor | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a `[B, T]` per-token loss to a scalar (see the module docstring for the scaling)."""
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if loss_mat.shape != mask.shape:
        raise ValueError(
            f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must have the same shape"
        )
    if mode == "token-mean":
        _check_global(global_batch_tokens, name="global_batch_tokens", dp_size=dp_size)
        denom = (
            global_batch_tokens
            if global_batch_tokens is not None
            else mask.to(loss_mat.dtype).sum().clamp(min=1)
        )
        return masked_sum(loss_mat, mask) / denom * dp_size
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; use one of {list(LOSS_AGG_MODES)}")
    _check_global(global_batch_seqs, name="global_batch_seqs", dp_size=dp_size)
    tokens_per_seq = mask.to(loss_mat.dtype).sum(dim=-1)
    seq_losses = masked_sum(loss_mat, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        seq_losses = seq_losses / tokens_per_seq.clamp(min=1e-8)
    has_tokens = tokens_per_seq > 0
    denom = global_batch_seqs if global_batch_seqs is not None else has_tokens.sum().clamp(min=1)
    loss = masked_sum(seq_losses, has_tokens) / denom * dp_size
    if mode == "seq-mean-token-sum-norm":
        scale = loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1]
        if scale <= 0:
            raise ValueError(f"loss_scale_factor must be positive, got {scale}")
        loss = loss / scale
    return loss


POLICY_LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo", "cispo")
GSPO_LOG_RATIO_MAX = 10.0


def _token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    advantages = advantages.detach().to(like.dtype)
    if advantages.dim() == 1:
        return advantages.unsqueeze(-1).expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(advantages.shape)}")
    return advantages


def _ppo_clip(
    ratio: torch.Tensor, advantages: torch.Tensor, *, clip_ratio_low: float, clip_ratio_high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token: (unclipped, clipped, their maximum) of `-A * ratio`."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return unclipped, clipped, torch.maximum(unclipped, clipped)


def _vanilla_losses(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with dual clip (https://arxiv.org/abs/1912.09729), verl's "vanilla"."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_probs - old_log_probs, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    unclipped, clipped, clip_loss = _ppo_clip(
        torch.exp(log_ratio), advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
    )
    dual_bound = -advantages * clip_ratio_c
    losses = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).to(log_probs.dtype), response_mask),
            "pg_clipfrac_lower": masked_mean(
                ((clip_loss > dual_bound) & (advantages < 0)).to(log_probs.dtype), response_mask
            ),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return losses, metrics


def _gspo_losses(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (https://arxiv.org/abs/2507.18071) in its token form, as verl's `gspo`: every token of
    sequence i carries s_i,t = sg[s_i] * pi_t / sg[pi_t], whose value is the length-normalised
    sequence ratio s_i = exp(mean_t(log pi_t - log pi_old_t)) and whose gradient is s_i * grad log pi_t.
    Clipped as PPO without the dual clip. With one advantage per sequence and the sequence mean of
    token means this is sequence-level GSPO exactly; per-token advantages give GSPO-token."""
    log_ratio = log_probs - old_log_probs
    lengths = response_mask.to(log_probs.dtype).sum(dim=-1).clamp(min=1)
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1) / lengths
    token_log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))
    unclipped, clipped, losses = _ppo_clip(
        ratio, advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).to(log_probs.dtype), response_mask),
            "pg_clipfrac_lower": log_probs.new_zeros(()),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return losses, metrics


def _cispo_losses(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585), as verl's `cispo`:
    `-sg(clip(r, 1 - low, 1 + high)) * A * log pi`: every token keeps its gradient, weighted by the
    clipped importance ratio (no token is dropped by the clip, unlike PPO's)."""
    log_ratio = torch.clamp(log_probs - old_log_probs, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    losses = -clipped_ratio * advantages * log_probs
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((ratio != clipped_ratio).to(log_probs.dtype), response_mask),
            "pg_clipfrac_lower": log_probs.new_zeros(()),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return losses, metrics


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_mode: str = "vanilla",
    is_weights: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    global_batch_tokens: float | int | torch.Tensor | None = None,
    global_batch_seqs: float | int | torch.Tensor | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of `loss_mode` (verl's `policy_loss.loss_mode`): "vanilla" (PPO
    with dual clip), "gspo" or "cispo". `advantages` is `[B]` (broadcast over tokens) or `[B, T]`.
    `is_weights` ([B, T], rollout correction's truncated importance weights) multiply each token's
    loss after the clip, as verl's `rollout_is_weights`. GSPO's objective is the sequence mean of
    token means: it needs `loss_agg_mode="seq-mean-token-mean"`. Returns the aggregated loss and
    detached metrics of this shard: pg_clipfrac, pg_clipfrac_lower, ppo_kl."""
    if clip_ratio_low < 0.0 or clip_ratio_high < 0.0 or (loss_mode != "cispo" and clip_ratio_low > 1.0):
        raise ValueError(
            f"need 0 <= clip_ratio_low <= 1 (any size for cispo) and clip_ratio_high >= 0, got "
            f"{clip_ratio_low}, {clip_ratio_high}"
        )
    if log_probs.shape != old_log_probs.shape or log_probs.shape != response_mask.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)}, old_log_probs {tuple(old_log_probs.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must all be [B, T]"
        )
    advantages = _token_advantages(advantages, log_probs)
    old_log_probs = old_log_probs.detach()
    clips = {"clip_ratio_low": clip_ratio_low, "clip_ratio_high": clip_ratio_high}
    if loss_mode == "vanilla":
        losses, metrics = _vanilla_losses(
            log_probs, old_log_probs, advantages, response_mask, clip_ratio_c=clip_ratio_c, **clips
        )
    elif loss_mode == "gspo":
        if loss_agg_mode != "seq-mean-token-mean":
            raise ValueError(
                f"GSPO's objective is the sequence mean of token means; got loss_agg_mode={loss_agg_mode!r}"
            )
        losses, metrics = _gspo_losses(log_probs, old_log_probs, advantages, response_mask, **clips)
    elif loss_mode == "cispo":
        losses, metrics = _cispo_losses(log_probs, old_log_probs, advantages, response_mask, **clips)
    else:
        raise ValueError(f"unknown policy loss mode {loss_mode!r}; use one of {list(POLICY_LOSS_MODES)}")
    if is_weights is not None:
        if is_weights.shape != log_probs.shape:
            raise ValueError(f"is_weights must be [B, T] like log_probs, got {tuple(is_weights.shape)}")
        losses = losses * is_weights.detach().to(losses.dtype)
    loss = aggregate_loss(
        losses,
        response_mask,
        loss_agg_mode,
        global_batch_tokens=global_batch_tokens,
        global_batch_seqs=global_batch_seqs,
        dp_size=dp_size,
        loss_scale_factor=loss_scale_factor,
    )
    return loss, metrics


def _kl_forward(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    diff = log_probs - ref_log_probs
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff.square()
    # k3 (Schulman's low-variance estimator): exp(ref - logp) - (ref - logp) - 1, clamped for stability.
    neg = torch.clamp(-diff, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(neg) - neg - 1.0, min=-K3_CLAMP, max=K3_CLAMP)


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate (http://joschu.net/blog/kl-approx.html), with verl's names:
    `kl` is `k1`, `mse` is `k2`, `low_var_kl` is `k3`. A `+` suffix ("k3+") keeps the value of the
    estimator but takes the gradient of k2, which is the unbiased KL gradient (straight-through)."""
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; use one of {list(KL_KINDS)}")
    straight_through = kind.endswith("+")
    base = _KL_BASE[kind.removesuffix("+")]
    value = _kl_forward(log_probs, ref_log_probs, base)
    if not straight_through or base == "k2":
        return value
    k2 = _kl_forward(log_probs, ref_log_probs, "k2")
    return k2 - k2.detach() + value.detach()


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kind: str,
    loss_agg_mode: str = "token-mean",
    global_batch_tokens: float | int | torch.Tensor | None = None,
    global_batch_seqs: float | int | torch.Tensor | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """`kl_penalty` aggregated like the policy loss (same micro-batch / DP scaling)."""
    return aggregate_loss(
        kl_penalty(log_probs, ref_log_probs.detach(), kind),
        response_mask,
        loss_agg_mode,
        global_batch_tokens=global_batch_tokens,
        global_batch_seqs=global_batch_seqs,
        dp_size=dp_size,
        loss_scale_factor=loss_scale_factor,
    )


def entropy_from_logits(logits: torch.Tensor, *, chunk_rows: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: `logsumexp(z) - sum(softmax(z) * z)`.
    Entries of -inf (masked vocabulary) contribute 0. `chunk_rows`: over that many positions at a
    time (verl's entropy_from_logits_with_chunking): the same values, with the softmax's
    [positions, vocabulary] temporaries a chunk at a time instead of whole."""
    if chunk_rows is not None and logits[..., 0].numel() > chunk_rows:
        rows = logits.reshape(-1, logits.shape[-1])
        parts = [entropy_from_logits(rows[i : i + chunk_rows]) for i in range(0, rows.shape[0], chunk_rows)]
        return torch.cat(parts).reshape(logits.shape[:-1])
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if torch.isneginf(logits).any():
        logits = logits.masked_fill(torch.isneginf(logits), 0.0)
    return lse - (probs * logits).sum(dim=-1)
