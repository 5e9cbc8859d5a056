"""`PolicyBackend` on Megatron-Core through Megatron-Bridge.

Micro-batches go through megatron-core's `get_forward_backward_func()` (no pipelining, 1F1B or
interleaved, as the parallel sizes say). Log-probs and entropy are computed on each rank's
vocabulary shard of the logits (`vocab_parallel`), never on a gathered full vocabulary.

Loss scaling: megatron-core divides each micro-batch loss by the number of micro-batches and DDP
averages gradients over data-parallel ranks; `grpo_math` normalises every micro-batch loss by the
whole mini-batch and multiplies by `dp_size`, so the loss handed back to the schedule is multiplied
by the number of micro-batches to cancel megatron's division.
Megatron is imported lazily: this module imports anywhere; `from_config` needs megatron + CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import structlog
import torch
import torch.distributed as dist

from grpo_config.schema import TrainerConfig
from grpo_trainer import grpo_math
from grpo_trainer.backends.megatron.batching import split_micro_batches
from grpo_trainer.backends.megatron.build import BuiltPolicy, build_optimizer, build_policy, wire_model_config
from grpo_trainer.backends.megatron.state import load_policy_state, policy_state
from grpo_trainer.backends.megatron.vocab_parallel import vocab_parallel_log_probs
from grpo_trainer.protocols import PolicyBatch

log = structlog.get_logger()

_TOKEN_MEAN_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "kl")
_SUMMED_METRICS = ("pg_loss", "kl_loss", "loss")


class MegatronBackend:
    """Call every method on every rank in the same order (they run collectives)."""

    def __init__(
        self,
        cfg: TrainerConfig,
        *,
        device: torch.device | None = None,
        policy: BuiltPolicy | None = None,
        ref: BuiltPolicy | None = None,
    ) -> None:
        """Builds the policy (and the reference model when actor.use_kl_loss) from
        `cfg.actor.model_path` unless given. `device` is accepted for `make_backend`; the device is
        the CUDA device of this process (LOCAL_RANK)."""
        from megatron.core import parallel_state

        if policy is None:
            if not cfg.actor.model_path:
                raise ValueError("actor.model_path is empty: set it to an HF checkpoint directory")
            policy, ref = _build_models(cfg, model_path=cfg.actor.model_path)
        self.cfg = cfg
        self.actor = cfg.actor
        self.policy = policy
        self.ref = ref
        self.model = policy.model
        self.optimizer = build_optimizer(cfg, self.model, megatron=cfg.actor.megatron)
        wire_model_config(self.model, self.optimizer)
        self.steps_done = 0
        self._mpu = parallel_state
        self.device = torch.device("cuda", torch.cuda.current_device())

    @classmethod
    def from_config(cls, cfg: TrainerConfig, *, model_path: str) -> MegatronBackend:
        policy, ref = _build_models(cfg, model_path=model_path)
        return cls(cfg, policy=policy, ref=ref)

    # -- forward machinery ----------------------------------------------------------------------
    def _micro_batches(self, batch: PolicyBatch, *, size: int) -> tuple[list[PolicyBatch], list[list[int]]]:
        pipelined = self.policy.layout.pp > 1
        return split_micro_batches(
            batch,
            micro_batch_size=size,
            max_tokens=self.actor.ppo_max_token_len_per_device if self.actor.use_dynamic_bsz else None,
            same_width=pipelined,
            multiple=self.policy.layout.tp if self.cfg.parallel.sequence_parallel else 1,
        )

    def _forward_step(
        self, loss_fn: Callable[..., Any], data_iterator: Iterator[PolicyBatch], model: Any
    ) -> Any:
        micro = next(data_iterator)
        input_ids = micro.input_ids.to(self.device)
        position_ids = torch.arange(input_ids.shape[1], device=self.device).unsqueeze(0).expand_as(input_ids)
        # Right padding + causal attention: real tokens never attend to the padding after them.
        logits = model(input_ids, position_ids, None)
        return logits, partial(loss_fn, micro)

    def _token_log_probs(
        self, micro: PolicyBatch, logits: torch.Tensor, *, with_entropy: bool, entropy_grad: bool = True
    ) -> tuple[Any, Any]:
        tp_rank = self._mpu.get_tensor_model_parallel_rank()
        targets = micro.input_ids[:, 1:].to(self.device)
        log_probs, entropy = vocab_parallel_log_probs(
            logits[:, :-1],
            targets,
            vocab_start=tp_rank * logits.shape[-1],
            group=self._mpu.get_tensor_model_parallel_group(),
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
        pad = log_probs.new_zeros(log_probs.shape[0], 1)
        log_probs = torch.cat([pad, log_probs], dim=1)
        if entropy is not None:
            entropy = torch.cat([pad, entropy], dim=1)
        return log_probs, entropy

    def _run(
        self, model: list[Any], micros: list[PolicyBatch], loss_fn: Callable[..., Any], *, forward_only: bool
    ) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        iterators: Any = iter(micros)
        if len(model) > 1:
            iterators = [iter(micros) for _ in model]
        width = max(m.input_ids.shape[1] for m in micros)
        return get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, loss_fn),
            data_iterator=iterators,
            model=model,
            num_microbatches=len(micros),
            seq_length=width,
            micro_batch_size=max(m.input_ids.shape[0] for m in micros),
            forward_only=forward_only,
        )

    # -- log-probs --------------------------------------------------------------------------------
    def log_probs(self, batch: PolicyBatch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        return self._log_probs(self.model, batch, with_entropy=with_entropy)

    def ref_log_probs(self, batch: PolicyBatch) -> torch.Tensor:
        """Log-probs under the frozen reference policy (built when actor.use_kl_loss)."""
        if self.ref is None:
            raise ValueError("no reference model: it is only built when actor.use_kl_loss=true")
        return self._log_probs(self.ref.model, batch, with_entropy=False)["log_probs"]

    @torch.no_grad()
    def _log_probs(
        self, model: list[Any], batch: PolicyBatch, *, with_entropy: bool
    ) -> dict[str, torch.Tensor]:
        rows, width = batch.input_ids.shape
        micros, groups = self._micro_batches(batch, size=self.actor.log_prob_micro_batch_size_per_device)

        def loss_fn(micro: PolicyBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            log_probs, entropy = self._token_log_probs(micro, logits, with_entropy=with_entropy)
            out = {"log_probs": log_probs.float()}
            if entropy is not None:
                out["entropy"] = entropy.float()
            return log_probs.new_zeros(()), out

        for chunk in model:
            chunk.eval()
        try:
            outputs = self._run(model, micros, loss_fn, forward_only=True)
        finally:
            for chunk in model:
                chunk.train()
        keys = ["log_probs", *(["entropy"] if with_entropy else [])]
        result = {key: torch.zeros(rows, width, dtype=torch.float32) for key in keys}
        if self._mpu.is_pipeline_last_stage(ignore_virtual=True):
            for group, out in zip(groups, outputs, strict=True):
                index = torch.tensor(group, dtype=torch.long)
                for key in keys:
                    values = out[key].cpu()[:, : min(width, out[key].shape[1])]
                    result[key][index, : values.shape[1]] = values
        return {key: self._from_last_stage(value) for key, value in result.items()}

    def _from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._mpu.get_pipeline_model_parallel_world_size() == 1:
            return tensor
        on_device = tensor.to(self.device)
        last = self._mpu.get_pipeline_model_parallel_last_rank()
        dist.broadcast(on_device, src=last, group=self._mpu.get_pipeline_model_parallel_group())
        return on_device.cpu()

    # -- update -----------------------------------------------------------------------------------
    def update(self, batch: PolicyBatch) -> dict[str, float]:
        if batch.advantages is None or batch.old_log_probs is None:
            raise ValueError("update() needs batch.advantages and batch.old_log_probs")
        if self.actor.use_kl_loss and batch.ref_log_probs is None:
            raise ValueError("actor.use_kl_loss=true but batch.ref_log_probs is None")
        dp_group = self._mpu.get_data_parallel_group()
        dp_size = self._mpu.get_data_parallel_world_size()
        tokens, seqs = grpo_math.loss_denominators(batch.response_mask)
        totals = torch.tensor([tokens, seqs], dtype=torch.float64, device=self.device)
        dist.all_reduce(totals, group=dp_group)
        global_tokens, global_seqs = (int(v) for v in totals.tolist())
        scale = {
            "loss_agg_mode": self.actor.loss_agg_mode,
            "global_batch_tokens": global_tokens,
            "global_batch_seqs": global_seqs,
            "dp_size": dp_size,
        }
        micros, _ = self._micro_batches(batch, size=self.actor.ppo_micro_batch_size_per_device)
        loss_fn = partial(self._policy_loss, scale=scale, num_microbatches=len(micros))
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        self._apply_lr_schedule()
        outputs = self._run(self.model, micros, loss_fn, forward_only=False)
        stepped, grad_norm, _ = self.optimizer.step()
        self.steps_done += 1
        metrics = self._reduce_metrics(outputs, global_tokens=global_tokens, dp_size=dp_size)
        metrics.update(
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=float(self.optimizer.param_groups[0]["lr"]),
            step_skipped=float(not stepped),
        )
        return metrics

    def _policy_loss(
        self, micro: PolicyBatch, logits: torch.Tensor, *, scale: dict[str, Any], num_microbatches: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = micro.response_mask.to(self.device).float()
        # Entropy is always logged; it carries a gradient only when it is part of the loss.
        log_probs, entropy = self._token_log_probs(
            micro, logits, with_entropy=True, entropy_grad=bool(self.actor.entropy_coeff)
        )
        pg_loss, pg_metrics = grpo_math.policy_loss(
            log_probs,
            micro.old_log_probs.to(self.device),
            micro.advantages.to(self.device),
            mask,
            clip_ratio_low=self.actor.clip_ratio_low,
            clip_ratio_high=self.actor.clip_ratio_high,
            clip_ratio_c=self.actor.clip_ratio_c,
            **scale,
        )
        loss = pg_loss
        tokens = mask.sum()
        sums = {
            name: torch.zeros((), device=self.device) for name in (*_TOKEN_MEAN_METRICS, *_SUMMED_METRICS)
        }
        if self.actor.entropy_coeff:
            mode = {
                "mode": scale["loss_agg_mode"],
                **{k: v for k, v in scale.items() if k != "loss_agg_mode"},
            }
            loss = loss - self.actor.entropy_coeff * grpo_math.aggregate_loss(entropy, mask, **mode)
        if self.actor.use_kl_loss:
            ref = micro.ref_log_probs.to(self.device)
            kl_loss = grpo_math.kl_loss(log_probs, ref, mask, kind=self.actor.kl_loss_type, **scale)
            loss = loss + self.actor.kl_loss_coef * kl_loss
            sums["kl_loss"] = kl_loss.detach()
            sums["kl"] = (
                grpo_math.masked_mean(grpo_math.kl_penalty(log_probs.detach(), ref, "k1"), mask) * tokens
            )
        sums["loss"] = loss.detach()
        sums["pg_loss"] = pg_loss.detach()
        for name, value in pg_metrics.items():
            sums[name] = value * tokens
        sums["entropy"] = grpo_math.masked_mean(entropy.detach(), mask) * tokens
        return loss * num_microbatches, sums

    def _reduce_metrics(self, outputs: list[dict], *, global_tokens: int, dp_size: int) -> dict[str, float]:
        names = (*_TOKEN_MEAN_METRICS, *_SUMMED_METRICS)
        totals = torch.zeros(len(names), dtype=torch.float64, device=self.device)
        if self._mpu.is_pipeline_last_stage(ignore_virtual=True):
            for out in outputs:
                totals += torch.stack([out[name].double() for name in names])
        if self._mpu.get_pipeline_model_parallel_world_size() > 1:
            dist.all_reduce(totals, group=self._mpu.get_pipeline_model_parallel_group())
        dist.all_reduce(totals, group=self._mpu.get_data_parallel_group())
        metrics = dict(zip(names, totals.tolist(), strict=True))
        for name in _TOKEN_MEAN_METRICS:
            metrics[name] /= max(global_tokens, 1)
        for name in _SUMMED_METRICS:
            metrics[name] /= dp_size
        return metrics

    def _apply_lr_schedule(self) -> None:
        warmup = max(self.actor.lr_warmup_steps, 0)
        factor = min(1.0, (self.steps_done + 1) / warmup) if warmup else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.actor.lr * factor

    # -- weights and state ------------------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors through the bridge (gathered over TP/PP/EP on every rank)."""
        yield from self.policy.bridge.export_hf_weights(self.model, cpu=False, show_progress=False)

    def export_hf(self, path: str, *, strict: bool = True) -> Any:
        """HF safetensors of the current weights (grpo_ckpt's strict export when it is available)."""
        try:
            from grpo_ckpt import export_hf
        except ImportError:
            self.policy.bridge.save_hf_weights(self.model, path, show_progress=False, strict=strict)
            return None
        return export_hf(self.policy.bridge, self.model, path, strict=strict)

    def state_dict(self) -> dict[str, Any]:
        return policy_state(self.model, self.optimizer, steps_done=self.steps_done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = load_policy_state(self.model, self.optimizer, state)


def _build_models(cfg: TrainerConfig, *, model_path: str) -> tuple[BuiltPolicy, BuiltPolicy | None]:
    if cfg.parallel.cp > 1:
        raise ValueError(
            "parallel.cp > 1 is not supported by the megatron backend's log-prob path yet; set parallel.cp=1"
        )
    policy = build_policy(cfg, model_path=model_path)
    ref = None
    if cfg.actor.use_kl_loss:
        ref_path = cfg.ref.model_path or model_path
        ref = build_policy(cfg, model_path=ref_path, megatron=cfg.ref.megatron, trainable=False)
    return policy, ref
