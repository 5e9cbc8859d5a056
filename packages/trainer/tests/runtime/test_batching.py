"""Row layout, data-parallel / mini-batch splits and micro-batch planning (pure tensor code)."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.backends.micro_batches import plan_micro_batches, split_by_count, split_by_tokens
from grpo_trainer.rollout_step import split_ranks, step_seed
from grpo_trainer.step_batch import dp_row_split, pad_rows, take_rows


def test_pad_rows_puts_prompt_then_response_then_padding() -> None:
    batch = pad_rows([[5, 6], [7]], [[8, 9, 1], [4]], pad_token_id=0, rollout_log_probs=[[-1, -2, -3], [-4]])
    assert batch.input_ids.tolist() == [[5, 6, 8, 9, 1], [7, 4, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert batch.extra["rollout_log_probs"].tolist() == [[0, 0, -1, -2, -3], [0, -4, 0, 0, 0]]
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        pad_rows([[1], [2]], [[3]], pad_token_id=0)


def test_dp_row_split_gives_every_rank_its_slice_of_every_mini_batch() -> None:
    shards = dp_row_split(16, num_mini_batches=2, dp_size=2)
    assert shards == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    assert sorted(i for s in dp_row_split(24, num_mini_batches=3, dp_size=4) for i in s) == list(range(24))
    with pytest.raises(ValueError, match="do not split into 3 mini-batches x 2 ranks"):
        dp_row_split(16, num_mini_batches=3, dp_size=2)


def test_take_rows_selects_and_trims_every_per_token_tensor() -> None:
    batch = pad_rows([[5, 6], [7], [1, 2, 3]], [[8], [4], [9, 9, 9]], pad_token_id=0, rollout_log_probs=None)
    batch.advantages = torch.tensor([1.0, 2.0, 3.0])
    batch.old_log_probs = torch.arange(18, dtype=torch.float32).reshape(3, 6)
    sub = take_rows(batch, [1, 0])
    assert sub.input_ids.tolist() == [[7, 4, 0], [5, 6, 8]]
    assert sub.advantages.tolist() == [2.0, 1.0]
    assert sub.old_log_probs.tolist() == [[6, 7, 8], [0, 1, 2]]
    assert sub.ref_log_probs is None


def test_split_by_tokens_respects_the_padded_budget() -> None:
    lengths = [3, 9, 4, 4, 2, 12, 5]
    groups = split_by_tokens(lengths, max_tokens=12)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        cost = len(group) * max(lengths[i] for i in group)
        assert cost <= 12 or len(group) == 1
    assert [5] in groups  # the 12-token row fills a micro-batch alone
    assert groups == split_by_tokens(lengths, max_tokens=12)
    assert split_by_count(5, size=2) == [[0, 1], [2, 3], [4]]


def test_plan_picks_tokens_or_count() -> None:
    batch = pad_rows([[1]] * 4, [[2] * 7, [2], [2], [2]], pad_token_id=0)
    by_tokens = plan_micro_batches(batch, use_dynamic_bsz=True, micro_batch_size=1, max_token_len=8)
    assert by_tokens == [[0], [1, 2, 3]]
    assert plan_micro_batches(batch, use_dynamic_bsz=False, micro_batch_size=3, max_token_len=1) == [
        [0, 1, 2],
        [3],
    ]


def test_split_ranks_and_step_seeds() -> None:
    assert split_ranks(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_ranks([1, 2], 4) == [[1], [2], [], []]
    seeds = {step_seed(1, step, rank) for step in range(50) for rank in range(4)}
    assert len(seeds) == 200 and all(0 <= s < 2**31 for s in seeds)
    assert step_seed(1, 3, 0) == step_seed(1, 3, 0) != step_seed(2, 3, 0)
