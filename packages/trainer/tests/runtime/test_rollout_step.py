"""The driver's rollout helpers with the real HF engine (two "ranks" in-process) and real rewards:
per-rank seeds, generations gathered by prompt, scores, group advantages and metrics."""

from __future__ import annotations

import pytest
import torch

from grpo_tiny.task import DATA_SOURCE as TINY_DATA_SOURCE
from grpo_tiny.task import score as tiny_score
from grpo_trainer.algo import grpo_math
from grpo_trainer.data import PromptItem
from grpo_trainer.driver.sampling import (
    gather_rollout,
    reward_items,
    rollout_metrics,
    seeded_per_rank,
    split_ranks,
    step_seed,
)
from grpo_trainer.protocols import SamplingParams
from grpo_trainer.rewards import RewardManager
from grpo_trainer.rollout import HFRolloutEngine


def test_rollout_scores_groups_and_normalises_advantages_per_prompt(model, tokenizer) -> None:
    engine = HFRolloutEngine(
        model=model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    items = [
        PromptItem(
            prompt_ids=tokenizer(f"repeat {d}", add_special_tokens=False)["input_ids"],
            ground_truth=str(d),
            data_source=TINY_DATA_SOURCE,
            index=d,
            raw_prompt=f"repeat {d}",
        )
        for d in range(3)
    ]
    chunks = split_ranks(items, 2)
    params = seeded_per_rank(SamplingParams(n=6, max_tokens=6), [step_seed(1, 4, rank) for rank in range(2)])
    assert params[0].seed != params[1].seed  # each rank samples with its own seed
    outputs = [engine.generate([p.prompt_ids for p in chunk], sp) for chunk, sp in zip(chunks, params, strict=True)]
    rollout = gather_rollout(chunks, outputs, n=6)
    texts = tokenizer.batch_decode([g.token_ids for g in rollout.generations], skip_special_tokens=True)
    with RewardManager(timeout_s=10, custom_fn=tiny_score, isolation="thread") as rewards:
        scored = rewards.score(reward_items(rollout.items, texts))
    scores = torch.tensor(scored.scores)
    advantages = grpo_math.group_advantages(scores, rollout.group_ids, norm_by_std=True, eps=1e-6)
    assert [i.index for i in rollout.items] == [0] * 6 + [1] * 6 + [2] * 6
    assert rollout.group_ids == [0] * 6 + [1] * 6 + [2] * 6
    for k, (item, text) in enumerate(zip(rollout.items, texts, strict=True)):
        chars = [c for c in text if not c.isspace()]
        expected = sum(c == item.ground_truth for c in chars) / len(chars) if chars else 0.0
        assert scores[k].item() == pytest.approx(expected, abs=1e-7)
    for g in range(3):
        r, a = scores[6 * g : 6 * g + 6], advantages[6 * g : 6 * g + 6]
        if r.std() > 0:
            torch.testing.assert_close(a, (r - r.mean()) / (r.std() + 1e-6))
        else:
            assert not a.any()
    metrics = rollout_metrics(rollout, rewards=scores, advantages=advantages, scored=scored)
    assert metrics["reward/mean"] == float(scores.mean())
    assert 1 <= metrics["response_length/mean"] <= 6


def test_gather_rollout_refuses_a_short_answer() -> None:
    item = PromptItem(prompt_ids=[1], ground_truth="1", data_source="x", index=0, raw_prompt="r")
    with pytest.raises(RuntimeError, match="returned 0 generations for 1 prompts x n=2"):
        gather_rollout([[item]], [[]], n=2)
