"""A generation round's responses in prompt order with their scores (the reward function's) and
rewards (after DAPO's overlong shaping): what every rollout mode hands the step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from grpo_config.schema import RewardConfig
from grpo_trainer.algo.reward_shaping import overlong_penalty
from grpo_trainer.data import PromptItem
from grpo_trainer.driver.sampling import Rollout, gather_rollout, reward_items
from grpo_trainer.driver.timing import PhaseTimer
from grpo_trainer.protocols import Generation
from grpo_trainer.rewards import RewardManager, RewardResult
from grpo_trainer.rewards.manager import AllRewardsFailedError


@dataclass(kw_only=True)
class Sampled:
    """A step's responses with their scores and rewards, [B] each, and the sampling metrics."""

    rollout: Rollout
    scored: RewardResult
    scores: torch.Tensor
    rewards: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)

    def take(self, indices: Sequence[int]) -> Sampled:
        index = torch.tensor(list(indices), dtype=torch.long)
        return Sampled(
            rollout=self.rollout.take(indices),
            scored=self.scored,
            scores=self.scores.index_select(0, index),
            rewards=self.rewards.index_select(0, index),
            metrics=dict(self.metrics),
        )

    @classmethod
    def concat(cls, parts: Sequence[Sampled]) -> Sampled:
        scored = RewardResult(
            scores=[x for p in parts for x in p.scores.tolist()],
            n_errors=sum(p.scored.n_errors for p in parts),
            n_timeouts=sum(p.scored.n_timeouts for p in parts),
            n_unknown_source=sum(p.scored.n_unknown_source for p in parts),
        )
        return cls(
            rollout=Rollout.concat([p.rollout for p in parts]),
            scored=scored,
            scores=torch.cat([p.scores for p in parts]),
            rewards=torch.cat([p.rewards for p in parts]),
        )


class Scorer:
    """Scores generations with the reward manager and shapes them as `reward.overlong_buffer` says;
    reads the `reward` section only (and the response budget the rollout was given)."""

    def __init__(
        self,
        section: RewardConfig,
        rewards: RewardManager,
        *,
        decode: Callable[[list[list[int]]], list[str]],
        max_tokens: int,
    ) -> None:
        self.section = section
        self.rewards = rewards
        self.decode = decode
        self.max_tokens = max_tokens

    def score(
        self,
        chunks: list[list[PromptItem]],
        outputs: list[list[Generation]],
        *,
        n: int,
        timer: PhaseTimer,
        step: int,
    ) -> Sampled:
        """A round's generations (`n` per prompt of each replica's chunk) in prompt order; raises
        AllRewardsFailedError when no reward call of step `step` succeeded."""
        rollout = gather_rollout(chunks, outputs, n=n)
        with timer("reward"):
            texts = self.decode([g.token_ids for g in rollout.generations])
            scored = self.rewards.score(reward_items(rollout.items, texts))
        if scored.all_failed:
            raise AllRewardsFailedError(self._failure(scored, step))
        scores = torch.tensor(scored.scores, dtype=torch.float64)
        rewards = scores
        buffer = self.section.overlong_buffer
        if buffer.enable:
            lengths = torch.tensor([len(g.token_ids) for g in rollout.generations])
            rewards = scores + overlong_penalty(
                lengths,
                budget=buffer.max_response_length or self.max_tokens,
                buffer_len=buffer.len,
                penalty_factor=buffer.penalty_factor,
            )
        return Sampled(rollout=rollout, scored=scored, scores=scores, rewards=rewards)

    def overlong_metrics(self, sampled: Sampled) -> Sampled:
        """The overlong penalty's mean and the share penalised over the step's batch, when
        `reward.overlong_buffer.log` asks for them."""
        buffer = self.section.overlong_buffer
        if buffer.enable and buffer.log:
            penalty = sampled.rewards - sampled.scores
            sampled.metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
            sampled.metrics["reward/overlong_fraction"] = float((penalty < 0).double().mean())
        return sampled

    def _failure(self, scored: RewardResult, step: int) -> str:
        reward = self.section
        fix = (
            f"fix reward.custom_fn ({reward.custom_fn})"
            if reward.custom_fn
            else "set reward.custom_fn, or give the rows a data_source that has a reward function"
        )
        if scored.n_timeouts:
            fix += f", or raise reward.timeout_s ({reward.timeout_s:g} s for the whole batch)"
        return (
            f"every reward call of step {step} failed ({scored.n_errors} raised, {scored.n_timeouts} "
            f"timed out, {scored.n_unknown_source} had no reward function of {len(scored.scores)}); the "
            f"first: {scored.first_failure}. Training on these scores (all 0) would learn nothing: {fix}."
        )
