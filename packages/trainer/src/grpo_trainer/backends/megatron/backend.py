"""`PolicyBackend` on Megatron-Core through Megatron-Bridge: primitives only (batching, loss, LR
schedule and metrics are `grpo_trainer.workers.actor.Actor`'s).

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.backend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch
import torch.distributed as dist

from grpo_config.schema import ActorConfig, TrainerConfig
from grpo_device import DeviceKind
from grpo_trainer.backends.megatron import offload
from grpo_trainer.backends.megatron.build import (
    BuiltPolicy,
    build_optimizer,
    build_policy,
    megatron_device,
    use_fused_torch_adam,
    wire_model_config,
)
from grpo_trainer.backends.megatron.imports import import_megatron_stack
from grpo_trainer.backends.megatron.state import STATE_DIRECTORY, load_policy_state, save_policy_state
from grpo_trainer.backends.megatron.vision_tower import VisionLanguage, decoder_input
from grpo_trainer.backends.megatron.vocab_parallel import vocab_parallel_log_probs
from grpo_trainer.devices import resolve_device_kind
from grpo_trainer.protocols import MicroLoss, PolicyBatch, StepResult, TokenOutputs
from grpo_trainer.vision import join_rows

if TYPE_CHECKING:
    from grpo_ckpt import ExportReport

log = structlog.get_logger()

# What the schedule's loss callback sees: (micro-batch index, micro-batch, this stage's logits).
_StepLoss = Callable[[int, PolicyBatch, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class MegatronBackend:
    """Call every method on every rank in the same order (they run collectives)."""

    def __init__(
        self,
        actor: ActorConfig,
        *,
        policy: BuiltPolicy,
        ref: BuiltPolicy | None,
        park_ref: bool,
        kind: DeviceKind,
    ) -> None:
        """Reads the `actor` section (optimizer, offload); `policy` and `ref` are built
        (`for_config`); `park_ref` (`ref.megatron.param_offload`) keeps the reference weights on
        the CPU but for its log-probs. The device is the accelerator this process was given
        (LOCAL_RANK)."""
        import_megatron_stack(kind)  # MindSpeed's adaptor first on NPU, before any megatron import
        from megatron.core import parallel_state

        self.settings = actor
        self.policy = policy
        self.ref = ref
        self.model = policy.model
        self.optimizer = build_optimizer(actor, self.model)
        wire_model_config(self.model, self.optimizer)
        self._mpu = parallel_state
        self.device = megatron_device(kind)
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self._offloaded: offload.Offloaded | None = None
        self._park_ref = ref is not None and park_ref
        self._parked_ref = offload.offload([ref.model], None, grads=False) if self._park_ref and ref else None

    @classmethod
    def for_config(cls, cfg: TrainerConfig, *, model_path: str | None = None) -> MegatronBackend:
        """The policy (and the reference model for a KL loss or KL in the reward) built from
        `model_path` (default `actor.model_path`) with the sections that shape them (actor, ref,
        parallel, data lengths, seed, device)."""
        path = model_path or cfg.actor.model_path
        if not path:
            raise ValueError("actor.model_path is empty: set it to an HF checkpoint directory")
        kind = resolve_device_kind(cfg)
        policy, ref = _build_models(cfg, model_path=path, kind=kind)  # build_policy imports the stack first
        park_ref = bool(cfg.ref.megatron and cfg.ref.megatron.param_offload)
        return cls(cfg.actor, policy=policy, ref=ref, park_ref=park_ref, kind=kind)

    def data_parallel_sum(self, values: torch.Tensor) -> torch.Tensor:
        summed = values.to(device=self.device, dtype=torch.float64, copy=True)
        dist.all_reduce(summed, group=self._mpu.get_data_parallel_group())
        return summed.cpu()

    # -- the schedule -------------------------------------------------------------------------------
    def _forward_step(
        self,
        step_loss: _StepLoss,
        vision_language: VisionLanguage | None,
        data_iterator: Iterator[tuple[int, PolicyBatch]],
        model: Any,
    ) -> Any:
        index, micro = next(data_iterator)
        input_ids = micro.input_ids.to(self.device)
        vision = join_rows(micro.vision)
        # Right padding + causal attention: real tokens never attend to the padding after them.
        if vision_language is None:
            if vision:
                raise ValueError("image inputs reached a text-only Megatron model")
            position_ids = torch.arange(input_ids.shape[1], device=self.device).unsqueeze(0).expand_as(input_ids)
            logits = model(input_ids, position_ids, None)
        else:
            position_ids = vision_language.positions(input_ids, vision)
            words_and_images = decoder_input(model, input_ids, vision, image_token_id=vision_language.image_token_id)
            logits = model(input_ids, position_ids, None, decoder_input=words_and_images)
        return logits, partial(step_loss, index, micro)

    def _token_log_probs(
        self, micro: PolicyBatch, logits: torch.Tensor, *, with_entropy: bool, entropy_grad: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
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
        valid = micro.attention_mask[:, 1:].to(device=self.device, dtype=log_probs.dtype)  # padding reads 0
        pad = log_probs.new_zeros(log_probs.shape[0], 1)
        log_probs = torch.cat([pad, log_probs * valid], dim=1)
        if entropy is not None:
            entropy = torch.cat([pad, entropy * valid], dim=1)
        return log_probs, entropy

    def _run(self, built: BuiltPolicy, micros: Sequence[PolicyBatch], step_loss: _StepLoss, *, forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        model = built.model
        numbered = list(enumerate(micros))
        iterators: Any = iter(numbered) if len(model) == 1 else [iter(numbered) for _ in model]
        return get_forward_backward_func()(
            forward_step_func=partial(self._forward_step, step_loss, built.vision_language),
            data_iterator=iterators,
            model=model,
            num_microbatches=len(micros),
            seq_length=max(m.input_ids.shape[1] for m in micros),
            micro_batch_size=max(m.input_ids.shape[0] for m in micros),
            forward_only=forward_only,
        )

    def _last_stage(self) -> bool:
        return self._mpu.is_pipeline_last_stage(ignore_virtual=True)

    def _pipelined(self) -> bool:
        return self._mpu.get_pipeline_model_parallel_world_size() > 1

    # -- log-probs ----------------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, micros: Sequence[PolicyBatch], *, ref: bool, with_entropy: bool) -> list[TokenOutputs]:
        if ref and self._parked_ref is not None:
            offload.onload(self._parked_ref, device=self.device)
            try:
                return self._log_probs(micros, ref=True, with_entropy=with_entropy)
            finally:
                self._parked_ref = offload.offload([self.ref.model], None, grads=False)
        return self._log_probs(micros, ref=ref, with_entropy=with_entropy)

    def _log_probs(self, micros: Sequence[PolicyBatch], *, ref: bool, with_entropy: bool) -> list[TokenOutputs]:
        built = self.ref if ref else self.policy
        if built is None:
            raise ValueError(
                "no reference model: it is only built when actor.use_kl_loss or algorithm.use_kl_in_reward"
            )
        model = built.model
        if not micros:
            return []

        def step_loss(index: int, micro: PolicyBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            log_probs, entropy = self._token_log_probs(micro, logits, with_entropy=with_entropy)
            out = {"log_probs": log_probs.float()}
            if entropy is not None:
                out["entropy"] = entropy.float()
            return log_probs.new_zeros(()), out

        for chunk in model:
            chunk.eval()
        try:
            outputs = self._run(built, micros, step_loss, forward_only=True)
        finally:
            for chunk in model:
                chunk.train()
        keys = ["log_probs", *(["entropy"] if with_entropy else [])]
        results = []
        for index, micro in enumerate(micros):
            out = {}
            for key in keys:
                value = outputs[index][key] if self._last_stage() else torch.zeros(micro.input_ids.shape, device=self.device)
                out[key] = self._from_last_stage(value).cpu()
            results.append(out)
        return results

    def _from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._pipelined():
            return tensor
        on_device = tensor.to(self.device, dtype=torch.float32).contiguous()
        last = self._mpu.get_pipeline_model_parallel_last_rank()
        dist.broadcast(on_device, src=last, group=self._mpu.get_pipeline_model_parallel_group())
        return on_device

    # -- training -----------------------------------------------------------------------------------
    def forward_backward(self, micros: Sequence[PolicyBatch], loss_fn: MicroLoss) -> torch.Tensor:
        count = len(micros)

        def step_loss(index: int, micro: PolicyBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            log_probs, entropy = self._token_log_probs(
                micro, logits, with_entropy=True, entropy_grad=loss_fn.entropy_requires_grad
            )
            loss, metrics = loss_fn(index, log_probs, entropy)
            return loss * count, {"metrics": metrics}

        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run(self.policy, micros, step_loss, forward_only=False)
        sums = torch.zeros(loss_fn.num_metrics, dtype=torch.float64, device=self.device)
        if self._last_stage():
            for out in outputs:
                sums += out["metrics"].to(self.device, torch.float64)
        if self._pipelined():
            dist.all_reduce(sums, group=self._mpu.get_pipeline_model_parallel_group())
        return sums.cpu()

    def optimizer_step(self, *, lr: float) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        stepped, grad_norm, _ = self.optimizer.step()
        return StepResult(
            stepped=bool(stepped), grad_norm=float(grad_norm) if grad_norm is not None else float("nan")
        )

    # -- weights and state --------------------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors through the bridge (gathered over TP/PP/EP on every rank)."""
        yield from self.policy.bridge.export_hf_weights(self.model, cpu=False, show_progress=False)

    def generation_module(self) -> None:
        """The chunks are shards of the policy: an engine gets the full weights by sync instead."""
        return None

    def model_config(self) -> Any:
        """megatron-core's TransformerConfig the chunks were built with."""
        from megatron.core.utils import get_model_config

        return get_model_config(self.model[0])

    def export_hf(self, path: str, *, strict: bool) -> ExportReport:
        """HF safetensors through Megatron-Bridge `save_hf_weights(strict=...)`, with grpo_ckpt's
        expected-vs-written key report."""
        from grpo_ckpt import export_hf

        return export_hf(
            self.policy.bridge,
            self.model,
            path,
            strict=strict,
            vision_language_source=self.policy.vision_language_source,
        )

    state_directory = STATE_DIRECTORY

    def save_state(self, directory: Path, *, optimizer: bool) -> None:
        save_policy_state(self.model, self.optimizer, directory, with_optimizer=optimizer)

    def load_state(self, directory: Path) -> None:
        load_policy_state(self.model, self.optimizer, directory)
        # The optimizer's param groups keep this run's settings; fused Adam where it can run.
        use_fused_torch_adam(self.optimizer)

    def offload(self, *, weights: bool, grads: bool, optimizer: bool) -> None:
        if self._offloaded is None:
            # An optimizer offloaded by Megatron itself already keeps its state on the CPU.
            on_cpu = self.settings.megatron.optimizer_offload_fraction > 0 or self.settings.megatron.optimizer_offload
            moved_optimizer = self.optimizer if optimizer and not on_cpu else None
            self._offloaded = offload.offload([self.model], moved_optimizer, weights=weights, grads=grads)

    def onload(self) -> None:
        if self._offloaded is not None:
            offload.onload(self._offloaded, device=self.device)
            self._offloaded = None


def _build_models(
    cfg: TrainerConfig, *, model_path: str, kind: DeviceKind
) -> tuple[BuiltPolicy, BuiltPolicy | None]:
    """The policy and, with a KL loss or KL in the reward, the frozen reference (build_policy imports the
    Megatron stack first, MindSpeed's adaptor on NPU)."""
    if cfg.parallel.cp > 1:
        raise ValueError(
            "parallel.cp > 1 is not supported by the megatron backend's log-prob path yet; set parallel.cp=1"
        )
    policy = build_policy(cfg, model_path=model_path, kind=kind)
    ref = None
    if cfg.uses_reference_model:
        ref_path = cfg.ref.model_path or model_path
        megatron = cfg.ref.megatron.for_build(cfg.actor.megatron) if cfg.ref.megatron else None
        ref = build_policy(cfg, model_path=ref_path, megatron=megatron, trainable=False, kind=kind)
    return policy, ref
