"""The driver's side of a rollout, as pure functions: prompts spread over ranks with per-rank
sampling seeds, the ranks' generations gathered in prompt order with their GRPO group ids, reward
items, and the rollout's metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grpo_trainer.data import PromptItem
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rewards import RewardItem, RewardResult


@dataclass(kw_only=True)
class Rollout:
    items: list[PromptItem]  # one per sequence (a prompt repeated n times)
    generations: list[Generation]
    group_ids: list[int]  # sequences of the same prompt share an id

    def take(self, indices: Sequence[int]) -> Rollout:
        return Rollout(
            items=[self.items[i] for i in indices],
            generations=[self.generations[i] for i in indices],
            group_ids=[self.group_ids[i] for i in indices],
        )

    @classmethod
    def concat(cls, parts: Sequence[Rollout]) -> Rollout:
        """One rollout of `parts` in order; group ids renumbered so that groups stay apart."""
        out = cls(items=[], generations=[], group_ids=[])
        offset = 0
        for part in parts:
            out.items += part.items
            out.generations += part.generations
            out.group_ids += [offset + g for g in part.group_ids]
            offset += max(part.group_ids, default=-1) + 1
        return out


def step_seed(seed: int, step: int, rank: int, round_index: int = 0) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, rank, generation round)."""
    return (seed * 1_000_003 + step * 10_007 + rank * 101 + round_index * 7_000_009) % (2**31 - 1)


def groups_with_spread(values: Sequence[float], group_ids: Sequence[int]) -> list[int]:
    """The groups DAPO's dynamic sampling keeps, in first-seen order: those whose `values` are not
    all equal (population std > 0) and those of a single response, as verl's `filter_groups`."""
    by_group: dict[int, list[float]] = {}
    for group, value in zip(group_ids, values, strict=True):
        by_group.setdefault(group, []).append(float(value))
    return [g for g, vs in by_group.items() if len(vs) == 1 or float(np.std(vs)) > 0]


def split_ranks(values: Sequence[Any], parts: int) -> list[list[Any]]:
    """Consecutive chunks whose sizes differ by at most one, the larger ones first."""
    size, extra = divmod(len(values), parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return [list(values[bounds[i] : bounds[i + 1]]) for i in range(parts)]


def seeded_per_rank(params: SamplingParams, seeds: Sequence[int]) -> list[SamplingParams]:
    return [SamplingParams(**{**vars(params), "seed": seed}) for seed in seeds]


def gather_rollout(chunks: Sequence[Sequence[PromptItem]], outputs: Sequence[Sequence[Generation]], *, n: int) -> Rollout:
    """Each rank's generations (`n` per prompt of its chunk) in one list, in prompt order."""
    items: list[PromptItem] = []
    generations: list[Generation] = []
    group_ids: list[int] = []
    offset = 0
    for chunk, gens in zip(chunks, outputs, strict=True):
        if len(gens) != len(chunk) * n:
            raise RuntimeError(f"engine returned {len(gens)} generations for {len(chunk)} prompts x n={n}")
        for gen in gens:
            items.append(chunk[gen.prompt_index])
            generations.append(gen)
            group_ids.append(offset + gen.prompt_index)
        offset += len(chunk)
    return Rollout(items=items, generations=generations, group_ids=group_ids)


def reward_items(items: Sequence[PromptItem], texts: Sequence[str]) -> list[RewardItem]:
    return [
        RewardItem(
            solution_str=text,
            ground_truth=item.ground_truth,
            data_source=item.data_source,
            extra_info=item.extra_info,
        )
        for item, text in zip(items, texts, strict=True)
    ]


def rollout_metrics(
    rollout: Rollout, *, rewards: torch.Tensor, advantages: torch.Tensor, scored: RewardResult
) -> dict[str, float]:
    lengths = torch.tensor([len(g.token_ids) for g in rollout.generations], dtype=torch.float32)
    count = len(rollout.generations)
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "reward/errors": float(scored.n_errors + scored.n_timeouts),
        "reward/unknown_source": float(scored.n_unknown_source),
        "advantage/abs_mean": float(advantages.abs().mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_ratio": sum(g.finish_reason == "length" for g in rollout.generations) / count,
        "prompt_length/mean": sum(len(i.prompt_ids) for i in rollout.items) / count,
        **tool_metrics(rollout.generations),
    }


def tool_metrics(generations: Sequence[Generation]) -> dict[str, float]:
    """Multi-turn responses' turns and tool calls, per response (none when no response used the loop).
    `multi_turn/call_rate`: the share of responses that called a tool at least once."""
    uses = [g.tools for g in generations if g.tools is not None]
    if not uses:
        return {}
    count = len(uses)
    calls = sum(u.tool_calls for u in uses)
    sampled = sum(sum(g.mask) if g.mask is not None else len(g.token_ids) for g in generations)
    return {
        "multi_turn/assistant_turns_mean": sum(u.assistant_turns for u in uses) / count,
        "multi_turn/tool_calls_mean": calls / count,
        "multi_turn/call_rate": sum(u.tool_calls > 0 for u in uses) / count,
        "multi_turn/tool_errors": float(sum(u.tool_errors for u in uses)),
        "multi_turn/tool_timeouts": float(sum(u.tool_timeouts for u in uses)),
        "multi_turn/tool_seconds": sum(u.tool_seconds for u in uses),
        "multi_turn/sampled_tokens_mean": sampled / len(generations),
        "multi_turn/tool_tokens_mean": sum(u.tool_tokens for u in uses) / count,
    }
