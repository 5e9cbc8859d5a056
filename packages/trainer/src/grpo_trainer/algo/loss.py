"""The GRPO loss, in one place: clipped policy loss (dual clip) + KL to the reference + entropy
bonus, aggregated as `actor.loss_agg_mode` says, and the token-mean metrics of a mini-batch.
Every backend calls this object; no backend holds loss math. The formulas are `grpo_math`'s.

The derivation: docs/INTERNALS.md, `grpo_trainer.algo.loss`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from grpo_config.schema import ActorConfig
from grpo_trainer.algo import grpo_math
from grpo_trainer.protocols import PolicyBatch

# Averaged over the response tokens of the whole mini-batch.
TOKEN_MEAN_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "kl")
# Scaled like the loss: summed over micro-batches and ranks, they give the full-batch value x dp_size.
LOSS_METRICS = ("pg_loss", "kl_loss", "entropy_loss", "loss")
METRIC_NAMES = (*LOSS_METRICS, *TOKEN_MEAN_METRICS)


@dataclass(frozen=True, kw_only=True)
class LossScale:
    """Sizes of one whole mini-batch (every micro-batch on every data-parallel rank)."""

    global_tokens: int
    global_seqs: int
    dp_size: int

    @classmethod
    def of(
        cls,
        response_masks: Iterable[torch.Tensor],
        *,
        dp_size: int,
        all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
    ) -> LossScale:
        """From this rank's micro-batch masks; `all_reduce_sum` sums a tensor over the data-parallel
        ranks (identity when there is one)."""
        tokens = seqs = 0
        for mask in response_masks:
            t, s = grpo_math.loss_denominators(mask)
            tokens, seqs = tokens + t, seqs + s
        totals = all_reduce_sum(torch.tensor([tokens, seqs], dtype=torch.float64))
        # A mini-batch whose every token is masked out (rollout rejection, overlong filtering) has a
        # zero loss; a denominator of 1 keeps it finite.
        global_tokens, global_seqs = (max(int(v), 1) for v in totals.tolist())
        return cls(global_tokens=global_tokens, global_seqs=global_seqs, dp_size=dp_size)


class GRPOLoss:
    """`loss(...)` on one micro-batch returns the scalar to back-propagate and a vector of metric
    sums (`METRIC_NAMES` order); `metrics(...)` turns the sums of a mini-batch into its metrics."""

    metric_names = METRIC_NAMES

    def __init__(
        self,
        *,
        clip_ratio_low: float,
        clip_ratio_high: float,
        clip_ratio_c: float,
        loss_agg_mode: str,
        loss_mode: str = "vanilla",
        entropy_coeff: float,
        kl_coef: float | None,
        kl_type: str,
        loss_scale_factor: float,
    ) -> None:
        if loss_agg_mode not in grpo_math.LOSS_AGG_MODES:
            raise ValueError(
                f"unknown loss_agg_mode {loss_agg_mode!r}; use one of {list(grpo_math.LOSS_AGG_MODES)}"
            )
        if loss_scale_factor <= 0:
            raise ValueError(f"loss_scale_factor must be positive, got {loss_scale_factor}")
        self.clip_ratio_low = clip_ratio_low
        self.clip_ratio_high = clip_ratio_high
        self.clip_ratio_c = clip_ratio_c
        self.loss_agg_mode = loss_agg_mode
        self.loss_mode = loss_mode
        self.entropy_coeff = entropy_coeff
        self.kl_coef = kl_coef  # None: no KL term (actor.use_kl_loss=false)
        self.kl_type = kl_type
        self.loss_scale_factor = float(loss_scale_factor)

    @classmethod
    def for_actor(cls, actor: ActorConfig, *, response_budget: int) -> GRPOLoss:
        """`actor`'s loss settings; `response_budget` (the most tokens a response may have) is the
        default `loss_scale_factor`."""
        return cls(
            clip_ratio_low=actor.clip_ratio_low,
            clip_ratio_high=actor.clip_ratio_high,
            clip_ratio_c=actor.clip_ratio_c,
            loss_agg_mode=actor.loss_agg_mode,
            loss_mode=actor.policy_loss.loss_mode,
            entropy_coeff=actor.entropy_coeff,
            kl_coef=actor.kl_loss_coef if actor.use_kl_loss else None,
            kl_type=actor.kl_loss_type,
            loss_scale_factor=actor.loss_scale_factor or response_budget,
        )

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef is not None

    @property
    def entropy_requires_grad(self) -> bool:
        """Entropy is always logged; it needs a gradient only when it is part of the loss."""
        return self.entropy_coeff != 0

    def _aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, scale: LossScale) -> torch.Tensor:
        return grpo_math.aggregate_loss(loss_mat, mask, self.loss_agg_mode, **self._scale_kwargs(scale))

    def _scale_kwargs(self, scale: LossScale) -> dict[str, float | int]:
        return {
            "global_batch_tokens": scale.global_tokens,
            "global_batch_seqs": scale.global_seqs,
            "dp_size": scale.dp_size,
            "loss_scale_factor": self.loss_scale_factor,
        }

    def loss(
        self,
        *,
        log_probs: torch.Tensor,
        entropy: torch.Tensor,
        micro: PolicyBatch,
        scale: LossScale,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`log_probs` / `entropy` ([B, T], the policy's, with gradient) of `micro`, whose
        old log-probs, advantages, mask (and reference log-probs when the KL term is on) are used."""
        if micro.advantages is None or micro.old_log_probs is None:
            raise ValueError("the loss needs the micro-batch's advantages and old_log_probs")
        device = log_probs.device
        mask = micro.response_mask.to(device=device, dtype=torch.float32)
        pg_loss, pg_metrics = grpo_math.policy_loss(
            log_probs,
            micro.old_log_probs.to(device),
            micro.advantages.to(device),
            mask,
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
            clip_ratio_c=self.clip_ratio_c,
            loss_mode=self.loss_mode,
            is_weights=None if micro.rollout_is_weights is None else micro.rollout_is_weights.to(device),
            # GSPO's term is the sequence mean of token means, whatever loss_agg_mode (which still
            # aggregates entropy and KL), as verl's compute_policy_loss_gspo.
            loss_agg_mode="seq-mean-token-mean" if self.loss_mode == "gspo" else self.loss_agg_mode,
            **self._scale_kwargs(scale),
        )
        entropy_loss = self._aggregate(entropy, mask, scale)
        loss = pg_loss - self.entropy_coeff * entropy_loss if self.entropy_coeff else pg_loss
        zero = pg_loss.new_zeros(())
        kl_loss = kl = zero
        if self.kl_coef is not None:
            if micro.ref_log_probs is None:
                raise ValueError("actor.use_kl_loss=true but the micro-batch has no ref_log_probs")
            ref = micro.ref_log_probs.to(device)
            kl_loss = self._aggregate(grpo_math.kl_penalty(log_probs, ref.detach(), self.kl_type), mask, scale)
            loss = loss + self.kl_coef * kl_loss
            kl = grpo_math.masked_mean(grpo_math.kl_penalty(log_probs.detach(), ref, "k1"), mask)
        tokens = mask.sum()
        values = {
            "pg_loss": pg_loss,
            "kl_loss": kl_loss,
            "entropy_loss": entropy_loss,
            "loss": loss,
            **{name: value * tokens for name, value in pg_metrics.items()},
            "entropy": grpo_math.masked_mean(entropy.detach(), mask) * tokens,
            "kl": kl * tokens,
        }
        sums = torch.stack([values[name].detach().float() for name in METRIC_NAMES])
        return loss, sums

    def over(self, micros: Sequence[PolicyBatch], scale: LossScale) -> MiniBatchLoss:
        """This loss on the micro-batches of one mini-batch, in the form backends call
        (`protocols.MicroLoss`)."""
        return MiniBatchLoss(self, micros, scale)

    def metrics(self, sums: Mapping[str, float], scale: LossScale) -> dict[str, float]:
        """Mini-batch metrics from `sums` (summed over micro-batches and data-parallel ranks)."""
        out = {name: float(sums[name]) / scale.dp_size for name in LOSS_METRICS}
        out.update({name: float(sums[name]) / max(scale.global_tokens, 1) for name in TOKEN_MEAN_METRICS})
        if self.kl_coef is None:
            out.pop("kl_loss")
            out.pop("kl")
        return out


class MiniBatchLoss:
    """`GRPOLoss` bound to one mini-batch's micro-batches and scale (`protocols.MicroLoss`)."""

    num_metrics = len(METRIC_NAMES)

    def __init__(self, loss: GRPOLoss, micros: Sequence[PolicyBatch], scale: LossScale) -> None:
        self._loss = loss
        self._micros = micros
        self.scale = scale
        self.entropy_requires_grad = loss.entropy_requires_grad

    def __call__(self, index: int, log_probs: torch.Tensor, entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._loss.loss(log_probs=log_probs, entropy=entropy, micro=self._micros[index], scale=self.scale)
