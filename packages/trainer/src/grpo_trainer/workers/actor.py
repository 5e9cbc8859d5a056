"""The policy under training, on one rank: log-prob passes and PPO updates composed from a
backend's primitives (`protocols.PolicyBackend`), the one batching path (`batching`), the one loss
(`loss.GRPOLoss`) and the one learning-rate schedule (`lr_schedule`). Backend-independent: the
torch and Megatron backends run exactly this code."""

from __future__ import annotations

from typing import Any

import torch

from grpo_config.schema import ActorConfig, RefConfig, TrainerConfig
from grpo_trainer.algo.loss import GRPOLoss, LossScale
from grpo_trainer.algo.lr_schedule import LRSchedule
from grpo_trainer.batching import (
    MicroBatch,
    MicroBatchShape,
    micro_batches,
    mini_batch_rows,
    plan_micro_batches,
    response_budget,
    row_lengths,
    scatter_rows,
    take_rows,
)
from grpo_trainer.protocols import PolicyBackend, PolicyBatch


class Actor:
    """Reads the `actor` section, and the `ref` one when a reference model is built (None: none)."""

    def __init__(
        self,
        actor: ActorConfig,
        backend: PolicyBackend,
        *,
        ref: RefConfig | None,
        shape: MicroBatchShape,
        response_budget: int,
    ) -> None:
        self.settings = actor
        self.ref = ref
        self.backend = backend
        self.loss = GRPOLoss.for_actor(actor, response_budget=response_budget)
        self.schedule = LRSchedule(lr=actor.lr, warmup_steps=actor.lr_warmup_steps)
        self.shape = shape

    @classmethod
    def for_config(cls, cfg: TrainerConfig, backend: PolicyBackend) -> Actor:
        """The sections of the root config this actor reads, picked once."""
        return cls(
            cfg.actor,
            backend,
            ref=cfg.ref if cfg.uses_reference_model else None,
            shape=MicroBatchShape.for_config(cfg),
            response_budget=response_budget(cfg),
        )

    def _micro_batches(
        self, batch: PolicyBatch, *, size: int, max_tokens: int | None, packed: bool
    ) -> list[MicroBatch]:
        """Micro-batches of `size` rows, or under a budget of `max_tokens` tokens when given
        (`packed`: the rows' own tokens count, as the backend runs them without padding).
        Collective with a token budget over several data-parallel ranks: they agree on one
        micro-batch count, the largest any of them plans."""
        count = None
        backend = self.backend
        if max_tokens is not None and backend.dp_size > 1:
            counts = torch.zeros(backend.dp_size, dtype=torch.float64)
            counts[backend.dp_rank] = len(
                plan_micro_batches(row_lengths(batch), micro_batch_size=size, max_tokens=max_tokens, packed=packed)
            )
            count = int(backend.data_parallel_sum(counts).max().item())
        return micro_batches(
            batch, micro_batch_size=size, max_tokens=max_tokens, shape=self.shape, count=count, packed=packed
        )

    def _log_prob_setting(self, name: str, *, ref: bool) -> Any:
        """`ref.<name>` for the reference model when set (grpo_config.load fills it from the
        actor), else `actor.<name>`."""
        own = getattr(self.ref, name) if ref and self.ref is not None else None
        return own if own is not None else getattr(self.settings, name)

    # -- log-probs --------------------------------------------------------------------------------
    def log_probs(self, batch: PolicyBatch, *, ref: bool = False, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """{"log_probs": [B, T]} (and "entropy") of `batch` under the policy or, with `ref`, the
        frozen reference, float32 on the CPU, in the batch's row order."""
        if ref and self.ref is None:
            raise ValueError(
                "no reference model: it is only built when actor.use_kl_loss or algorithm.use_kl_in_reward"
            )
        size = self._log_prob_setting("log_prob_micro_batch_size_per_device", ref=ref)
        dynamic = self._log_prob_setting("log_prob_use_dynamic_bsz", ref=ref)
        max_tokens = self._log_prob_setting("log_prob_max_token_len_per_device", ref=ref) if dynamic else None
        packed = self._log_prob_setting("use_remove_padding", ref=ref)
        micros = self._micro_batches(batch, size=size, max_tokens=max_tokens, packed=packed)
        outputs = self.backend.log_probs([m.batch for m in micros], ref=ref, with_entropy=with_entropy)
        rows, width = batch.input_ids.shape
        keys = ["log_probs", *(["entropy"] if with_entropy else [])]
        return {
            key: scatter_rows(
                [(m.rows, out[key]) for m, out in zip(micros, outputs, strict=True)], num_rows=rows, width=width
            )
            for key in keys
        }

    # -- update -----------------------------------------------------------------------------------
    def update(self, batch: PolicyBatch, *, num_mini_batches: int, ppo_epochs: int) -> dict[str, float]:
        """`ppo_epochs` passes over this rank's rows, split into `num_mini_batches` consecutive
        blocks (its slices of the step's mini-batches), one optimizer step each. Returns the
        metrics averaged over the steps, the same on every rank."""
        blocks = mini_batch_rows(batch.input_ids.shape[0], num_mini_batches)
        lr = self.schedule.lr  # constant within a training step, as verl's scheduler
        sums: dict[str, float] = {}
        for _ in range(ppo_epochs):
            for rows in blocks:
                for name, value in self.update_mini_batch(take_rows(batch, rows), lr=lr).items():
                    sums[name] = sums.get(name, 0.0) + value
        updates = ppo_epochs * len(blocks)
        if sums["step_skipped"] < updates:
            self.schedule.step()
        return {name: value / updates for name, value in sums.items()}

    def update_mini_batch(self, mini: PolicyBatch, *, lr: float | None = None) -> dict[str, float]:
        """One optimizer step on this rank's share of a mini-batch, at `lr` (default: the
        schedule's current rate; the schedule itself advances in `update`)."""
        if mini.advantages is None or mini.old_log_probs is None:
            raise ValueError("an update needs the batch's advantages and old_log_probs")
        if self.loss.uses_reference and mini.ref_log_probs is None:
            raise ValueError("actor.use_kl_loss=true but the batch has no ref_log_probs")
        actor = self.settings
        max_tokens = actor.ppo_max_token_len_per_device if actor.use_dynamic_bsz else None
        micros = [
            m.batch
            for m in self._micro_batches(
                mini, size=actor.ppo_micro_batch_size_per_device, max_tokens=max_tokens, packed=actor.use_remove_padding
            )
        ]
        backend = self.backend
        scale = LossScale.of(
            (m.response_mask for m in micros), dp_size=backend.dp_size, all_reduce_sum=backend.data_parallel_sum
        )
        sums = backend.data_parallel_sum(backend.forward_backward(micros, self.loss.over(micros, scale)))
        lr = self.schedule.lr if lr is None else lr
        step = backend.optimizer_step(lr=lr)
        metrics = self.loss.metrics(dict(zip(self.loss.metric_names, sums.tolist(), strict=True)), scale)
        metrics.update(grad_norm=step.grad_norm, lr=lr, step_skipped=float(not step.stepped))
        return metrics
