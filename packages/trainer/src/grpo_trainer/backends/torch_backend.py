"""`PolicyBackend` on a Hugging Face causal LM with plain torch: AdamW, linear lr warmup, grad
clipping, micro-batching with gradient accumulation, DDP over the default process group (gloo on
CPU, nccl/hccl on accelerators; set up by the worker), and a frozen reference model for the KL loss.

Padding removal (`use_remove_padding`) needs varlen attention kernels that CPU lacks; instead every
micro-batch is cut to its longest row, and `use_dynamic_bsz` packs rows by a padded-token budget.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import structlog
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from grpo_config.schema import TrainerConfig
from grpo_trainer import grpo_math
from grpo_trainer.backends.hf_model import autocast_context, load_causal_lm, token_log_probs
from grpo_trainer.backends.micro_batches import plan_micro_batches
from grpo_trainer.protocols import PolicyBatch
from grpo_trainer.step_batch import take_rows

log = structlog.get_logger()

# Metrics averaged over response tokens of the whole mini-batch (all ranks).
_TOKEN_MEAN_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "kl")


def _dp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    if _dp_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


class TorchBackend:
    """Data-parallel policy on one device per process. Call it on every rank in the same order:
    `update` and `log_probs` with `dp_size > 1` run collectives."""

    def __init__(self, cfg: TrainerConfig, *, device: torch.device) -> None:
        self.cfg = cfg
        self.actor = cfg.actor
        self.device = device
        self.dp_size = _dp_size()
        self.module = load_causal_lm(cfg.actor.model_path, device=device)
        self.ref_module: torch.nn.Module | None = None
        if cfg.actor.use_kl_loss:
            ref_path = cfg.ref.model_path or cfg.actor.model_path
            self.ref_module = (
                copy.deepcopy(self.module)
                if ref_path == cfg.actor.model_path
                else load_causal_lm(ref_path, device=device)
            )
            self.ref_module.requires_grad_(False).eval()
        if cfg.actor.gradient_checkpointing:
            self.module.gradient_checkpointing_enable()
        self.module.train()
        self.model: torch.nn.Module = (
            DistributedDataParallel(self.module, device_ids=None if device.type == "cpu" else [device])
            if self.dp_size > 1
            else self.module
        )
        self.optimizer = torch.optim.AdamW(
            self.module.parameters(), lr=cfg.actor.lr, weight_decay=cfg.actor.weight_decay
        )
        warmup = max(cfg.actor.lr_warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        ref_dtype = cfg.ref.dtype or cfg.actor.dtype
        self._autocast = lambda: autocast_context(device, cfg.actor.dtype)
        self._ref_autocast = lambda: autocast_context(device, ref_dtype)

    # -- log-probs -------------------------------------------------------------------------
    def _log_prob_plan(self, batch: PolicyBatch, micro_batch_size: int) -> list[list[int]]:
        return plan_micro_batches(
            batch,
            use_dynamic_bsz=self.actor.use_dynamic_bsz,
            micro_batch_size=micro_batch_size,
            max_token_len=self.actor.ppo_max_token_len_per_device,
        )

    @torch.no_grad()
    def _forward_log_probs(
        self,
        module: torch.nn.Module,
        batch: PolicyBatch,
        *,
        micro_batch_size: int,
        with_entropy: bool,
        ref: bool,
    ) -> dict[str, torch.Tensor]:
        rows, width = batch.input_ids.shape
        out = {"log_probs": torch.zeros(rows, width, dtype=torch.float32)}
        if with_entropy:
            out["entropy"] = torch.zeros(rows, width, dtype=torch.float32)
        was_training = module.training
        module.eval()
        try:
            for group in self._log_prob_plan(batch, micro_batch_size):
                micro = take_rows(batch, group)
                with self._ref_autocast() if ref else self._autocast():
                    log_probs, entropy = token_log_probs(
                        module,
                        micro.input_ids.to(self.device),
                        micro.attention_mask.to(self.device),
                        with_entropy=with_entropy,
                    )
                index = torch.tensor(group, dtype=torch.long)
                cols = log_probs.shape[1]
                out["log_probs"][index, :cols] = log_probs.cpu()
                if entropy is not None:
                    out["entropy"][index, :cols] = entropy.cpu()
        finally:
            module.train(was_training)
        return out

    def log_probs(self, batch: PolicyBatch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        return self._forward_log_probs(
            self.module,
            batch,
            micro_batch_size=self.actor.log_prob_micro_batch_size_per_device,
            with_entropy=with_entropy,
            ref=False,
        )

    def ref_log_probs(self, batch: PolicyBatch) -> torch.Tensor:
        """Log-probs under the frozen reference policy (needs actor.use_kl_loss)."""
        if self.ref_module is None:
            raise ValueError("no reference model: it is only built when actor.use_kl_loss=true")
        size = (
            self.cfg.ref.log_prob_micro_batch_size_per_device
            or self.actor.log_prob_micro_batch_size_per_device
        )
        return self._forward_log_probs(
            self.ref_module, batch, micro_batch_size=size, with_entropy=False, ref=True
        )["log_probs"]

    # -- training --------------------------------------------------------------------------
    def update(self, batch: PolicyBatch) -> dict[str, float]:
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("update() needs batch.advantages and batch.old_log_probs")
        if self.actor.use_kl_loss and batch.ref_log_probs is None:
            raise ValueError("actor.use_kl_loss=true but batch.ref_log_probs is None")
        tokens, seqs = grpo_math.loss_denominators(batch.response_mask)
        global_tokens, global_seqs = (
            int(v) for v in _all_reduce_sum(torch.tensor([tokens, seqs], dtype=torch.float64)).tolist()
        )
        groups = plan_micro_batches(
            batch,
            use_dynamic_bsz=self.actor.use_dynamic_bsz,
            micro_batch_size=self.actor.ppo_micro_batch_size_per_device,
            max_token_len=self.actor.ppo_max_token_len_per_device,
        )
        sums = {name: 0.0 for name in (*_TOKEN_MEAN_METRICS, "pg_loss", "kl_loss", "loss")}
        self.optimizer.zero_grad(set_to_none=True)
        for position, group in enumerate(groups):
            micro = take_rows(batch, group)
            sync = position == len(groups) - 1
            context = self.model.no_sync() if (self.dp_size > 1 and not sync) else contextlib.nullcontext()
            with context:
                self._micro_step(micro, global_tokens, global_seqs, sums)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.actor.grad_clip)
        stepped = bool(torch.isfinite(grad_norm))
        if stepped:
            self.optimizer.step()
        else:
            log.warning("torch_backend.skip_step", reason="non-finite grad norm", grad_norm=float(grad_norm))
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        if stepped:  # the schedule counts optimiser steps
            self.scheduler.step()
        totals = _all_reduce_sum(torch.tensor(list(sums.values()), dtype=torch.float64))
        metrics = dict(zip(sums, totals.tolist(), strict=True))
        for name in _TOKEN_MEAN_METRICS:
            metrics[name] /= max(global_tokens, 1)
        for name in ("pg_loss", "kl_loss", "loss"):
            metrics[name] /= self.dp_size  # summed over micro-batches, averaged over ranks
        metrics.update(grad_norm=float(grad_norm), lr=lr, step_skipped=float(not stepped))
        return metrics

    def _micro_step(
        self, micro: PolicyBatch, global_tokens: int, global_seqs: int, sums: dict[str, float]
    ) -> None:
        mask = micro.response_mask.to(self.device).float()
        need_entropy = True  # cheap next to the forward; logged even when entropy_coeff is 0
        with self._autocast():
            log_probs, entropy = token_log_probs(
                self.model,
                micro.input_ids.to(self.device),
                micro.attention_mask.to(self.device),
                with_entropy=need_entropy,
            )
        scale = {
            "loss_agg_mode": self.actor.loss_agg_mode,
            "global_batch_tokens": global_tokens,
            "global_batch_seqs": global_seqs,
            "dp_size": self.dp_size,
        }
        old = micro.old_log_probs.to(self.device)
        pg_loss, pg_metrics = grpo_math.policy_loss(
            log_probs,
            old,
            micro.advantages.to(self.device),
            mask,
            clip_ratio_low=self.actor.clip_ratio_low,
            clip_ratio_high=self.actor.clip_ratio_high,
            clip_ratio_c=self.actor.clip_ratio_c,
            **scale,
        )
        loss = pg_loss
        tokens = float(mask.sum())
        if self.actor.entropy_coeff and entropy is not None:
            loss = loss - self.actor.entropy_coeff * grpo_math.aggregate_loss(entropy, mask, **_mode(scale))
        if self.actor.use_kl_loss:
            ref = micro.ref_log_probs.to(self.device)
            kl_loss = grpo_math.kl_loss(log_probs, ref, mask, kind=self.actor.kl_loss_type, **scale)
            loss = loss + self.actor.kl_loss_coef * kl_loss
            sums["kl_loss"] += float(kl_loss.detach())
            kl = grpo_math.kl_penalty(log_probs.detach(), ref, "k1")
            sums["kl"] += float(grpo_math.masked_mean(kl, mask)) * tokens
        loss.backward()
        sums["loss"] += float(loss.detach())
        sums["pg_loss"] += float(pg_loss.detach())
        for name, value in pg_metrics.items():
            sums[name] += float(value) * tokens
        if entropy is not None:
            sums["entropy"] += float(grpo_math.masked_mean(entropy.detach(), mask)) * tokens

    # -- weights and state -----------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.module.state_dict().items():
            yield name, tensor.detach()

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])


def _mode(scale: dict[str, Any]) -> dict[str, Any]:
    return {"mode": scale["loss_agg_mode"], **{k: v for k, v in scale.items() if k != "loss_agg_mode"}}
