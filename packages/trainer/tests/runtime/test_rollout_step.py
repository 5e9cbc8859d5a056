"""The driver's rollout phase with the real HF engine (two "ranks" in-process) and real rewards."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.data import PromptItem
from grpo_trainer.presets import TINY_DATA_SOURCE
from grpo_trainer.protocols import SamplingParams
from grpo_trainer.rewards import RewardManager
from grpo_trainer.rollout import HFRolloutEngine
from grpo_trainer.rollout_step import run_rollout


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
    calls = []

    def generate(per_rank, params):
        calls.append([p.seed for p in params])
        return [engine.generate(prompts, p) for prompts, p in zip(per_rank, params, strict=True)]

    with RewardManager(timeout_s=10, isolation="thread") as rewards:
        out = run_rollout(
            items,
            generate=generate,
            params=SamplingParams(n=6, max_tokens=6),
            world_size=2,
            step=4,
            seed=1,
            decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
            reward_manager=rewards,
            norm_by_std=True,
            eps=1e-6,
        )
    assert len(calls[0]) == 2 and calls[0][0] != calls[0][1]  # each rank samples with its own seed
    assert [i.index for i in out.items] == [0] * 6 + [1] * 6 + [2] * 6
    for k, (item, text) in enumerate(zip(out.items, out.texts, strict=True)):
        chars = [c for c in text if not c.isspace()]
        expected = sum(c == item.ground_truth for c in chars) / len(chars) if chars else 0.0
        assert out.rewards[k].item() == pytest.approx(expected, abs=1e-7)
    for g in range(3):
        r, a = out.rewards[6 * g : 6 * g + 6], out.advantages[6 * g : 6 * g + 6]
        if r.std() > 0:
            torch.testing.assert_close(a, (r - r.mean()) / (r.std() + 1e-6))
        else:
            assert not a.any()
    assert out.metrics["reward/mean"] == float(out.rewards.mean())
    assert 1 <= out.metrics["response_length/mean"] <= 6
