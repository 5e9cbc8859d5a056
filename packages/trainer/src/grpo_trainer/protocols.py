"""Interfaces between the trainer loop and its pluggable parts. Implementations live beside:
rollout engines in `grpo_trainer.rollout`, policy backends in `grpo_trainer.backends`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from grpo_ckpt import ExportReport


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    seed: int | None = None


@dataclass(kw_only=True)
class ToolUse:
    """What a multi-turn response did besides sampling: its turns and tool calls."""

    assistant_turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0  # calls answered with an error (bad call, crash, limit), timeouts apart
    tool_timeouts: int = 0
    tool_seconds: float = 0.0
    tool_tokens: int = 0  # ids the template added (tool messages, turn markers): mask 0


@dataclass(kw_only=True)
class Generation:
    """One sampled response. `logprobs[i]` is the engine's log-probability of `token_ids[i]`.
    A multi-turn response also holds the template's tool messages: `mask[i]` is 1 where the model
    sampled `token_ids[i]` and 0 where the template put it (log-prob 0 there); None: all sampled."""

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "length"  # "stop" (EOS) or "length"
    mask: list[int] | None = None
    tools: ToolUse | None = None


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, vision: Sequence[Any] | None = None
    ) -> list[Generation]:
        """Sample `params.n` responses for each prompt (token ids, no re-tokenising), with
        `vision[i]`, prompt i's vision inputs (`grpo_trainer.vision`), when given. Returns
        `len(prompts) * params.n` generations grouped by prompt, in prompt order."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors into the running engine, in place."""
        ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@dataclass(kw_only=True)
class PolicyBatch:
    """Right-padded token batch for the policy. Shapes: [B, T] for ids/masks/per-token values,
    [B] for per-sequence values. `response_mask` marks the tokens whose log-probs are trained."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    # Rollout correction's truncated importance weights [B, T], multiplying each token's policy loss.
    rollout_is_weights: torch.Tensor | None = None
    # Per row, its prompt's vision inputs (`grpo_trainer.vision`; None for a text prompt).
    vision: list[dict[str, torch.Tensor] | None] | None = None
    # The rollout engine's log-prob of each response token [B, T] (0 elsewhere), when it gave them.
    rollout_log_probs: torch.Tensor | None = None


# Per-token outputs of one micro-batch: {"log_probs": [B, T], "entropy": [B, T]}.
TokenOutputs = dict[str, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What one optimizer step did: `stepped` is False when it was skipped (non-finite gradients)."""

    stepped: bool
    grad_norm: float


class MicroLoss(Protocol):
    """A micro-batch's loss, written once in `grpo_trainer.algo.loss`; backends only call it:
    (the micro-batch's index in the list handed to `forward_backward`, the policy's per-token
    log-probs [B, T] and entropy [B, T], both with gradient) -> (the loss to back-propagate, a 1-D
    tensor of `num_metrics` metric sums). Entropy needs a gradient only when
    `entropy_requires_grad`."""

    num_metrics: int
    entropy_requires_grad: bool

    def __call__(
        self, index: int, log_probs: torch.Tensor, entropy: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class PolicyBackend(Protocol):
    """The primitives a policy implementation offers; `grpo_trainer.workers.actor.Actor` composes them into
    log-prob passes and updates (batching, loss, LR schedule and metrics live there, once).

    Micro-batches arrive already cut (`grpo_trainer.batching`), right-padded, with per-token
    tensors of shape [B, T]. Call every method on every rank in the same order: they run
    collectives. Per-token outputs are aligned to positions: value t is about `input_ids[:, t]`
    given the tokens before it; position 0 and padding read 0."""

    device: torch.device  # where the policy computes; losses are computed there
    dp_size: int  # data-parallel ranks of this policy (model-parallel ranks share rows)
    dp_rank: int  # this rank's position among them

    def data_parallel_sum(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the data-parallel ranks (a new CPU float64 tensor)."""
        ...

    def log_probs(
        self, micros: Sequence[PolicyBatch], *, ref: bool, with_entropy: bool
    ) -> list[TokenOutputs]:
        """Per micro-batch, {"log_probs": [B, T]} (and "entropy" when asked), float32 on the CPU,
        without gradient, under the policy or, with `ref`, the frozen reference policy (built only
        for a KL loss or KL in the reward)."""
        ...

    def forward_backward(self, micros: Sequence[PolicyBatch], loss_fn: MicroLoss) -> torch.Tensor:
        """Zero the gradients, then for each micro-batch: forward, `loss_fn`, backward (gradients
        accumulate; data-parallel reduction once, after the last). Returns the metric sums of all
        micro-batches (`[loss_fn.num_metrics]` float64 on the CPU, the same on every model-parallel
        rank)."""
        ...

    def optimizer_step(self, *, lr: float) -> StepResult:
        """Clip gradients to `actor.grad_clip` and step at learning rate `lr`, unless the gradient
        norm is not finite (then skip). Gradients are cleared."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors, for rollout weight sync and HF export."""
        ...

    def generation_module(self) -> torch.nn.Module | None:
        """The policy's own module when an in-process `hf` rollout engine may generate with it
        (no weight copy, no sync); None when the policy is sharded (Megatron)."""
        ...

    def model_config(self) -> Any:
        """The model's own configuration (HF config, or megatron-core's TransformerConfig), saved
        with each checkpoint as `transformer_config.json`."""
        ...

    def export_hf(self, path: str, *, strict: bool) -> ExportReport:
        """Hugging Face safetensors of the current weights under `path`; returns grpo_ckpt's
        `ExportReport` (expected vs written keys). Collective: every rank calls it."""
        ...

    def offload(self, *, weights: bool, grads: bool, optimizer: bool) -> None:
        """Move the policy's weights, gradients and / or optimizer state off the accelerator (for
        the rollout; see `grpo_trainer.workers.rollout_memory`)."""
        ...

    def onload(self) -> None:
        """Bring back what `offload` moved."""
        ...


@runtime_checkable
class TensorState(Protocol):
    """A backend whose checkpoint state `grpo_ckpt.CheckpointManager` stores (the torch backend)."""

    def state_dict(self) -> dict[str, Any]:
        """{"model": ..., "optimizer": ...}: this rank's shard, plain nested dicts of tensors."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class DirectoryState(Protocol):
    """A backend that writes its checkpoint state into a directory of the checkpoint itself (the
    Megatron backend: a distributed checkpoint that loads at another parallel layout)."""

    state_directory: str  # its name under global_step_N/

    def save_state(self, directory: Path, *, optimizer: bool) -> None:
        """Write the model (and, with `optimizer`, the optimizer's) state into the empty
        `directory`. Collective."""
        ...

    def load_state(self, directory: Path) -> None:
        """Restore what `save_state` wrote, at this run's layout. Collective."""
        ...
