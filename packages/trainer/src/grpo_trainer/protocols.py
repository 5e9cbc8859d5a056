"""Interfaces between the trainer loop and its pluggable parts. Implementations live beside:
rollout engines in `grpo_trainer.rollout`, policy backends in `grpo_trainer.backends`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 128
    seed: int | None = None


@dataclass(kw_only=True)
class Generation:
    """One sampled response. `logprobs[i]` is the engine's log-probability of `token_ids[i]`."""

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "length"  # "stop" (EOS) or "length"


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample `params.n` responses for each prompt (token ids, no re-tokenising). Returns
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
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class PolicyBackend(Protocol):
    def log_probs(self, batch: PolicyBatch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Per-token log-probs of `input_ids[:, 1:]` aligned to positions 1..T-1 (key "log_probs",
        shape [B, T], position 0 zero) and optionally "entropy" of the same shape."""
        ...

    def ref_log_probs(self, batch: PolicyBatch) -> torch.Tensor:
        """`log_probs` under the frozen reference policy ([B, T]); needs actor.use_kl_loss."""
        ...

    def update(self, batch: PolicyBatch) -> dict[str, float]:
        """One optimiser step over this rank's share of a mini-batch (micro-batched inside; loss
        denominators all-reduced over data-parallel ranks). Returns metrics of the whole
        mini-batch, the same on every rank."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors, for rollout weight sync and HF export."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
