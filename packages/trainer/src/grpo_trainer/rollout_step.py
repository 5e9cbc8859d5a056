"""The driver's side of one rollout: prompts spread over ranks, responses scored, advantages and
batch metrics. Orchestration-free: `generate` is any callable running the ranks' generation."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo_trainer import grpo_math
from grpo_trainer.data import PromptItem
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rewards import RewardItem, RewardManager

# Per-rank generation: a list (one entry per rank) of prompt lists -> a list of generation lists.
GenerateFn = Callable[[list[list[list[int]]], list[SamplingParams]], list[list[Generation]]]


@dataclass(kw_only=True)
class Rollout:
    items: list[PromptItem]  # one per sequence (a prompt repeated n times)
    generations: list[Generation]
    texts: list[str]
    rewards: torch.Tensor
    advantages: torch.Tensor
    metrics: dict[str, float]


def step_seed(seed: int, step: int, rank: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step, rank)."""
    return (seed * 1_000_003 + step * 10_007 + rank * 101) % (2**31 - 1)


def split_ranks(values: Sequence[Any], parts: int) -> list[list[Any]]:
    """Consecutive chunks whose sizes differ by at most one, the larger ones first."""
    size, extra = divmod(len(values), parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return [list(values[bounds[i] : bounds[i + 1]]) for i in range(parts)]


def run_rollout(
    prompts: list[PromptItem],
    *,
    generate: GenerateFn,
    params: SamplingParams,
    world_size: int,
    step: int,
    seed: int,
    decode: Callable[[list[list[int]]], list[str]],
    reward_manager: RewardManager,
    norm_by_std: bool,
    eps: float,
) -> Rollout:
    per_rank = split_ranks(prompts, world_size)
    rank_params = [
        SamplingParams(**{**vars(params), "seed": step_seed(seed, step, rank)}) for rank in range(world_size)
    ]
    started = time.perf_counter()
    outputs = generate([[p.prompt_ids for p in chunk] for chunk in per_rank], rank_params)
    generated = time.perf_counter()
    items: list[PromptItem] = []
    generations: list[Generation] = []
    group_ids: list[int] = []
    offset = 0
    for chunk, gens in zip(per_rank, outputs, strict=True):
        if len(gens) != len(chunk) * params.n:
            raise RuntimeError(
                f"engine returned {len(gens)} generations for {len(chunk)} prompts x n={params.n}"
            )
        for gen in gens:
            items.append(chunk[gen.prompt_index])
            generations.append(gen)
            group_ids.append(offset + gen.prompt_index)
        offset += len(chunk)
    texts = decode([g.token_ids for g in generations])
    result = reward_manager.score(
        [
            RewardItem(
                solution_str=text,
                ground_truth=item.ground_truth,
                data_source=item.data_source,
                extra_info=item.extra_info,
            )
            for item, text in zip(items, texts, strict=True)
        ]
    )
    rewards = torch.tensor(result.scores, dtype=torch.float32)
    scored = time.perf_counter()
    advantages = grpo_math.group_advantages(rewards, group_ids, norm_by_std=norm_by_std, eps=eps)
    lengths = torch.tensor([len(g.token_ids) for g in generations], dtype=torch.float32)
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "reward/errors": float(result.n_errors + result.n_timeouts),
        "reward/unknown_source": float(result.n_unknown_source),
        "advantage/abs_mean": float(advantages.abs().mean()),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_ratio": sum(g.finish_reason == "length" for g in generations)
        / len(generations),
        "prompt_length/mean": sum(len(i.prompt_ids) for i in items) / len(items),
        "time/generate_s": generated - started,
        "time/reward_s": scored - generated,
    }
    return Rollout(
        items=items,
        generations=generations,
        texts=texts,
        rewards=rewards,
        advantages=advantages,
        metrics=metrics,
    )
