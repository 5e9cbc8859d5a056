"""Rollout-training mismatch correction, as verl's `rollout_corr_helper` defines it (decoupled mode).

The derivation: docs/INTERNALS.md, `grpo_trainer.algo.rollout_correction`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_config.rejection import RejectionOption, parse_is_threshold, parse_rejection
from grpo_config.schema import RolloutCorrectionConfig
from grpo_trainer.algo.grpo_math import masked_mean, masked_sum

SAFETY_BOUND = 20.0
PREFIX = "rollout_corr/"


def _seq_masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row: the mean of `x` over its masked tokens (verl's `masked_mean(..., axis=-1)`)."""
    return masked_sum(x, mask, dim=-1) / (mask.sum(dim=-1) + 1e-8)


def mismatch_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's log-probs are from the training policy's (verl's off-policy
    diagnostics): perplexities, KL(rollout || old) as k1 and k3, per-sequence log-perplexity gaps,
    chi-squared divergences; plus the largest absolute per-token gap (`max_abs_log_prob_diff`)."""
    mask = mask.to(old.dtype)
    valid = mask.sum(dim=-1) > 0
    lr = old - rollout
    old_mean = _seq_masked_mean(old, mask)[valid]
    roll_mean = _seq_masked_mean(rollout, mask)[valid]
    gap = roll_mean - old_mean
    clamped = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_lr = masked_sum(clamped, mask, dim=-1)[valid].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    abs_diff = torch.where(mask > 0, lr.abs(), torch.zeros_like(lr))
    values = {
        "training_ppl": torch.exp(-old_mean).mean(),
        "training_log_ppl": (-old_mean).mean(),
        "rollout_ppl": torch.exp(-roll_mean).mean(),
        "rollout_log_ppl": (-roll_mean).mean(),
        "kl": masked_mean(rollout - old, mask),
        "k3_kl": masked_mean(torch.exp(lr) - lr - 1, mask),
        "log_ppl_diff": gap.mean(),
        "log_ppl_abs_diff": gap.abs().mean(),
        "log_ppl_diff_max": gap.max(),
        "log_ppl_diff_min": gap.min(),
        "ppl_ratio": torch.exp(gap).mean(),
        "chi2_token": masked_mean(torch.exp(clamped).square(), mask) - 1,
        "chi2_seq": torch.exp(2 * seq_lr).mean() - 1,
        "max_abs_log_prob_diff": abs_diff.max(),
    }
    return {PREFIX + name: float(value) for name, value in values.items()}


def _vmean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """verl's `masked_mean`: the masked sum over (the mask's count + 1e-8), so its diagnostics
    match to the last digits."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / (count + 1e-8)


def importance_weights(
    old: torch.Tensor,
    rollout: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str,
    threshold: float | str,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights ([B, T], 0 on padding, detached) and their diagnostics, as verl's
    `compute_rollout_correction_weights` and `compute_is_metrics` define them. `level` "token":
    `w_t = exp(lr_t)`; "sequence": every token of a sequence takes `exp(sum_t lr_t)`. A number as
    `threshold` caps the weights there (TIS); `"lower_upper"` sets those outside the band to 0
    (IcePop, with `rollout_is_oob_ratio`). With `batch_normalize` the applied weights are divided
    by their mean (tokens, or sequences). Which statistic reads the applied and which the raw
    weights: packages/trainer/README.md, "rollout correction"."""
    if level not in ("token", "sequence"):
        raise ValueError(f"rollout_is must be 'token' or 'sequence', got {level!r}")
    upper, band_lower = parse_is_threshold(threshold)
    mask = mask.to(old.dtype)
    if not mask.any():
        raise ValueError("rollout correction needs at least one response token")
    lr = (old - rollout).detach()
    if level == "token":
        log_ratio = lr
        raw = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_ratio = masked_sum(lr, mask, dim=-1).unsqueeze(-1)
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(lr)
    raw = raw * mask
    if band_lower is None:
        applied = raw.clamp(max=upper)
    else:
        applied = torch.where((raw >= band_lower) & (raw <= upper), raw, torch.zeros_like(raw))
    lower = 1.0 / upper if band_lower is None else band_lower
    metrics = {"rollout_is_mean": _vmean(applied, mask)}
    if level == "sequence":
        metrics["rollout_is_max"] = torch.exp(log_ratio.max().clamp(max=SAFETY_BOUND))
        metrics["rollout_is_min"] = torch.exp(log_ratio.min())
        metrics["rollout_is_ratio_fraction_high"] = (log_ratio > math.log(upper)).to(lr.dtype).mean()
        metrics["rollout_is_ratio_fraction_low"] = (log_ratio < math.log(lower)).to(lr.dtype).mean()
    else:
        metrics["rollout_is_ratio_fraction_high"] = _vmean((raw > upper).to(lr.dtype), mask)
        metrics["rollout_is_ratio_fraction_low"] = _vmean((raw < lower).to(lr.dtype), mask)
        metrics["rollout_is_max"] = applied.masked_fill(mask == 0, float("-inf")).max()
        metrics["rollout_is_min"] = applied.masked_fill(mask == 0, float("inf")).min()
    bounded = applied.clamp(min=0.0, max=upper)
    mean_b = _vmean(bounded, mask)
    metrics["rollout_is_std"] = (
        torch.sqrt((_vmean(bounded.square(), mask) - mean_b.square()).clamp(min=0))
        if mask.sum() > 1
        else lr.new_zeros(())
    )
    metrics["rollout_is_eff_sample_size"] = 1.0 / _vmean((bounded / (mean_b + 1e-8)).square(), mask)
    per_seq = _vmean(applied, mask, dim=-1)
    metrics["rollout_is_seq_mean"] = per_seq.mean()
    metrics["rollout_is_seq_std"] = per_seq.std() if per_seq.numel() > 1 else per_seq.new_zeros(())
    metrics["rollout_is_seq_max"] = per_seq.max()
    metrics["rollout_is_seq_min"] = per_seq.min()
    metrics["rollout_is_seq_max_deviation"] = (per_seq - 1).abs().max()
    raw_per_seq = _vmean(raw, mask, dim=-1)
    metrics["rollout_is_seq_fraction_high"] = (raw_per_seq > upper).to(lr.dtype).mean()
    metrics["rollout_is_seq_fraction_low"] = (raw_per_seq < lower).to(lr.dtype).mean()
    if band_lower is not None:
        metrics["rollout_is_oob_ratio"] = _vmean(((raw < band_lower) | (raw > upper)).to(lr.dtype), mask)
    if batch_normalize:
        if level == "token":
            factor = _vmean(applied, mask)
        else:
            has_tokens = (mask.sum(dim=-1) > 0).to(lr.dtype)
            factor = (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1e-8)
        if factor > 1e-8:
            applied = applied / factor
        else:
            factor = torch.ones(())
        metrics["rollout_is_batch_norm_factor"] = factor
    return applied.detach(), {PREFIX + name: float(value) for name, value in metrics.items()}


def _statistic(lr: torch.Tensor, stat: str) -> torch.Tensor:
    if stat == "k1":
        return -lr
    if stat == "k2":
        return 0.5 * lr.square()
    return torch.exp(lr) - 1 - lr


def rejection_mask(
    old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, options: list[RejectionOption]
) -> tuple[torch.Tensor, dict[str, float]]:
    """`mask` with the tokens (or whole sequences) rejected by any of `options` set to 0, and the
    share rejected per option and in all (`rollout_rs_masked_fraction`, of the valid tokens;
    `rollout_rs_seq_masked_fraction`, of the sequences)."""
    mask = mask.to(old.dtype)
    lr = (old - rollout).detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    valid = mask > 0
    keep_all = torch.ones_like(mask, dtype=torch.bool)
    metrics: dict[str, torch.Tensor] = {}
    for option in options:
        stat = _statistic(lr, option.stat)
        if option.scope == "token":
            value = stat
        elif option.scope == "seq_sum":
            value = masked_sum(stat, mask, dim=-1).unsqueeze(-1).expand_as(stat)
        elif option.scope == "seq_mean":
            value = _seq_masked_mean(stat, mask).unsqueeze(-1).expand_as(stat)
        else:  # seq_max
            filled = torch.where(valid, stat, torch.full_like(stat, -torch.inf)).max(dim=-1).values
            value = (
                torch.where(valid.any(dim=-1), filled, torch.zeros_like(filled)).unsqueeze(-1).expand_as(stat)
            )
        keep = (
            value <= torch.log(torch.tensor(option.upper)) if option.stat == "k1" else value <= option.upper
        )
        if option.lower is not None:
            keep = keep & (value >= torch.log(torch.tensor(option.lower)))
        keep_all &= keep
        name = f"rollout_rs_{option.name}"
        metrics[f"{name}_mean"] = masked_mean(value, mask)
        metrics[f"{name}_max"] = value[valid].max() if valid.any() else value.new_zeros(())
        metrics[f"{name}_min"] = value[valid].min() if valid.any() else value.new_zeros(())
        metrics[f"{name}_masked_fraction"] = masked_mean((~keep).to(lr.dtype), mask)
    new_mask = mask * keep_all.to(mask.dtype)
    rejected = (~keep_all) & valid
    metrics["rollout_rs_masked_fraction"] = masked_mean(rejected.to(lr.dtype), mask)
    metrics["rollout_rs_seq_masked_fraction"] = rejected.any(dim=-1).to(lr.dtype).mean()
    return new_mask, {PREFIX + name: float(value) for name, value in metrics.items()}


@dataclass(frozen=True)
class Correction:
    response_mask: torch.Tensor  # the loss mask after rejection (the input mask when rollout_rs is off)
    is_weights: torch.Tensor | None  # [B, T] truncated weights when rollout_is is on
    metrics: dict[str, float]


class RolloutCorrection:
    """`algorithm.rollout_correction`, parsed once; `apply` corrects one step's batch."""

    def __init__(self, cfg: RolloutCorrectionConfig) -> None:
        self.cfg = cfg
        self.options = (
            parse_rejection(cfg.rollout_rs, cfg.rollout_rs_threshold) if cfg.rollout_rs is not None else []
        )

    @property
    def enabled(self) -> bool:
        return self.cfg.rollout_is is not None or bool(self.options)

    def apply(self, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> Correction:
        """Weights and rejection both from the input mask (the loss then sees only the kept tokens)."""
        metrics: dict[str, float] = {}
        weights = None
        if self.cfg.rollout_is is not None:
            weights, is_metrics = importance_weights(
                old,
                rollout,
                mask,
                level=self.cfg.rollout_is,
                threshold=self.cfg.rollout_is_threshold,
                batch_normalize=self.cfg.rollout_is_batch_normalize,
            )
            metrics.update(is_metrics)
        if self.options:
            mask, rs_metrics = rejection_mask(old, rollout, mask, self.options)
            metrics.update(rs_metrics)
        return Correction(response_mask=mask, is_weights=weights, metrics=metrics)
