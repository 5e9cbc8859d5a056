"""A generation round as the engines take it: the prompts split over the rollout replicas, one
seeded `SamplingParams` each, and the prompts' pixel inputs, built once per prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_config.schema import RolloutConfig
from grpo_trainer.data import PromptItem
from grpo_trainer.driver.sampling import seeded_per_rank, split_ranks, step_seed
from grpo_trainer.protocols import SamplingParams
from grpo_trainer.vision import VisionInputs, pixel_inputs


@dataclass(kw_only=True)
class Round:
    """One generation round: its prompts per replica and their sampling settings (one per replica,
    seeded)."""

    chunks: list[list[PromptItem]]
    params: list[SamplingParams]

    @property
    def n(self) -> int:
        return self.params[0].n


class RoundPlanner:
    """Splits prompts over `replicas` engines with a seed per (step, replica, round); reads the
    `rollout` section's sampling settings (verl's val_kwargs for validation)."""

    def __init__(self, section: RolloutConfig, *, replicas: int, seed: int, max_tokens: int) -> None:
        self.section = section
        self.replicas = replicas
        self.seed = seed
        self.max_tokens = max_tokens

    def training(self, prompts: list[PromptItem], *, step: int, round_index: int = 0) -> Round:
        seeds = [step_seed(self.seed, step, replica, round_index) for replica in range(self.replicas)]
        return Round(
            chunks=split_ranks(prompts, self.replicas),
            params=seeded_per_rank(self.sampling_params(validation=False), seeds),
        )

    def validation(self, prompts: list[PromptItem]) -> Round:
        seeds = [self.seed + replica for replica in range(self.replicas)]
        return Round(
            chunks=split_ranks(prompts, self.replicas),
            params=seeded_per_rank(self.sampling_params(validation=True), seeds),
        )

    def sampling_params(self, *, validation: bool) -> SamplingParams:
        """Training: rollout.n/temperature/top_p/top_k. Validation as verl's val_kwargs: greedy and
        one response a prompt unless rollout.val_do_sample, then the val_* settings."""
        r = self.section
        if not validation:
            return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=self.max_tokens)
        if not r.val_do_sample:
            return SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=self.max_tokens)
        return SamplingParams(
            n=r.val_n, temperature=r.val_temperature, top_p=r.val_top_p, top_k=r.val_top_k, max_tokens=self.max_tokens
        )


class VisionCache:
    """A prompt's pixel inputs, built once per prompt by the model's image processor and kept until
    the step that trains on it is done (None for a text prompt)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self._inputs: dict[tuple[int, tuple[bytes, ...]], VisionInputs | None] = {}

    def of(self, item: PromptItem) -> VisionInputs | None:
        if not item.images:
            return None
        key = (item.index, item.images)
        if key not in self._inputs:
            self._inputs[key] = pixel_inputs(self.processor.image_processor, item.images)
        return self._inputs[key]

    def per_chunk(self, chunks: list[list[PromptItem]]) -> list[list[Any]] | None:
        """The chunks' pixel inputs as the engines take them; None when every prompt is text."""
        vision = [[self.of(p) for p in chunk] for chunk in chunks]
        return vision if any(v is not None for chunk in vision for v in chunk) else None

    def keep_only(self, items: list[PromptItem]) -> None:
        """Forget every prompt's inputs but those of `items` (a generation still in flight)."""
        keep = {(p.index, p.images) for p in items}
        self._inputs = {key: value for key, value in self._inputs.items() if key in keep}
