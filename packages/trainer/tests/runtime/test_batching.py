"""The one batching path (`grpo_trainer.batching`): row layout, data-parallel / mini-batch splits,
micro-batch planning and shapes, outputs back into batch order (pure tensor code)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import grpo_config
from grpo_trainer.batching import (
    MicroBatchShape,
    dp_row_split,
    micro_batches,
    mini_batch_rows,
    pad_rows,
    plan_micro_batches,
    scatter_rows,
    take_rows,
)
from grpo_trainer.driver.sampling import split_ranks, step_seed
from grpo_trainer.protocols import PolicyBatch


def test_pad_rows_puts_prompt_then_response_then_padding() -> None:
    batch = pad_rows([[5, 6], [7]], [[8, 9, 1], [4]], pad_token_id=0, rollout_log_probs=[[-1, -2, -3], [-4]])
    assert batch.input_ids.tolist() == [[5, 6, 8, 9, 1], [7, 4, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert batch.rollout_log_probs.tolist() == [[0, 0, -1, -2, -3], [0, -4, 0, 0, 0]]
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
    # Every field of the batch travels, whatever fields PolicyBatch gains.
    batch.vision = [{"pixel_values": torch.full((4, 2), float(i))} for i in range(3)]
    for number, f in enumerate(dataclasses.fields(PolicyBatch)):
        if f.name != "extra" and getattr(batch, f.name) is None:
            setattr(batch, f.name, torch.full((3, 6), float(number)))
    sub = take_rows(batch, [2])
    for f in dataclasses.fields(PolicyBatch):
        if f.name != "extra":
            assert getattr(sub, f.name) is not None, f.name
    assert sub.rollout_is_weights.shape == (1, 6)
    assert sub.vision == [batch.vision[2]]  # per-row values that are not one tensor


def test_token_budget_plan_respects_the_padded_budget() -> None:
    lengths = [3, 9, 4, 4, 2, 12, 5]
    groups = plan_micro_batches(lengths, micro_batch_size=1, max_tokens=12)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        cost = len(group) * max(lengths[i] for i in group)
        assert cost <= 12 or len(group) == 1
    assert [5] in groups  # the 12-token row fills a micro-batch alone
    assert groups == plan_micro_batches(lengths, micro_batch_size=1, max_tokens=12)
    assert plan_micro_batches([1] * 5, micro_batch_size=2, max_tokens=None) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="micro-batch size must be >= 1"):
        plan_micro_batches([1], micro_batch_size=0, max_tokens=None)


def test_a_packed_token_budget_counts_the_rows_own_tokens() -> None:
    """use_remove_padding: a micro-batch runs as one padding-free row, so the budget (as verl's
    with remove-padding) holds the sum of the lengths, not rows x the longest."""
    lengths = [8, 3, 1, 6]
    padded = plan_micro_batches(lengths, micro_batch_size=1, max_tokens=12)
    packed = plan_micro_batches(lengths, micro_batch_size=1, max_tokens=12, packed=True)
    # longest first: 8 alone (8 + 6 > 12 either way); then 6 and 3 (2 x 6 padded, 9 packed), and
    # the 1 joins them only packed (3 x 6 = 18 padded, 10 packed)
    assert padded == [[0], [3, 1], [2]]
    assert packed == [[0], [3, 1, 2]]
    # splitting to an agreed count cuts the micro-batch with the most tokens (10 > 8)
    assert plan_micro_batches(lengths, micro_batch_size=1, max_tokens=12, packed=True, count=3) == [[0], [3], [1, 2]]


def test_a_token_budget_plan_splits_further_to_an_agreed_count() -> None:
    """Ranks with different rows agree on the largest count; the costliest micro-batch splits."""
    lengths = [3, 3, 3, 3, 2, 2]  # fits one budget of 18
    assert plan_micro_batches(lengths, micro_batch_size=1, max_tokens=18) == [[0, 1, 2, 3, 4, 5]]
    three = plan_micro_batches(lengths, micro_batch_size=1, max_tokens=18, count=3)
    assert three == [[0], [1, 2], [3, 4, 5]]  # halves, then the first of two equal costs
    assert plan_micro_batches(lengths, micro_batch_size=1, max_tokens=18, count=6) == [[i] for i in range(6)]
    with pytest.raises(ValueError, match="into 7"):
        plan_micro_batches(lengths, micro_batch_size=1, max_tokens=18, count=7)


def test_micro_batches_by_tokens_or_count_each_cut_to_its_longest_row() -> None:
    batch = pad_rows([[1]] * 4, [[2] * 7, [2], [2], [2]], pad_token_id=0)
    by_tokens = micro_batches(batch, micro_batch_size=1, max_tokens=8)
    assert [m.rows for m in by_tokens] == [[0], [1, 2, 3]]
    assert [tuple(m.batch.input_ids.shape) for m in by_tokens] == [(1, 8), (3, 2)]
    by_count = micro_batches(batch, micro_batch_size=3, max_tokens=None)
    assert [m.rows for m in by_count] == [[0, 1, 2], [3]]
    assert [tuple(m.batch.input_ids.shape) for m in by_count] == [(3, 8), (1, 2)]


def test_parallel_layout_decides_the_micro_batch_shape() -> None:
    """Pipeline stages exchange one shape (every micro-batch as wide as the batch); sequence
    parallelism pads the width to a multiple of TP. Only the Megatron backend asks for either."""
    batch = pad_rows([[1]] * 4, [[2] * 6, [2], [2], [2]], pad_token_id=0)
    megatron = {"actor": {"backend": "megatron"}, "device": {"devices_per_node": 4}}
    pp = MicroBatchShape.for_config(grpo_config.load({**megatron, "parallel": {"pp": 2}}))
    assert pp == MicroBatchShape(same_width=True, multiple=1)
    assert [m.batch.input_ids.shape[1] for m in micro_batches(batch, micro_batch_size=2, max_tokens=None, shape=pp)] == [7, 7]
    sp = MicroBatchShape.for_config(grpo_config.load({**megatron, "parallel": {"tp": 4, "sequence_parallel": True}}))
    assert sp == MicroBatchShape(same_width=False, multiple=4)
    shaped = micro_batches(batch, micro_batch_size=2, max_tokens=None, shape=sp)
    assert [m.batch.input_ids.shape[1] for m in shaped] == [8, 4]
    assert not shaped[0].batch.attention_mask[:, 7:].any()  # the padding is padding
    assert MicroBatchShape.for_config(grpo_config.load({"parallel": {"tp": 1}})) == MicroBatchShape()


def test_outputs_return_to_batch_order_and_mini_batches_are_consecutive_blocks() -> None:
    parts = [([2, 0], torch.tensor([[5.0, 6.0, 7.0], [1.0, 2.0, 3.0]])), ([1], torch.tensor([[9.0]]))]
    assert scatter_rows(parts, num_rows=3, width=2).tolist() == [[1, 2], [9, 0], [5, 6]]
    assert mini_batch_rows(6, 3) == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="do not split into 4 mini-batches"):
        mini_batch_rows(6, 4)


def test_split_ranks_and_step_seeds() -> None:
    assert split_ranks(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_ranks([1, 2], 4) == [[1], [2], [], []]
    seeds = {step_seed(1, step, rank) for step in range(50) for rank in range(4)}
    assert len(seeds) == 200 and all(0 <= s < 2**31 for s in seeds)
    assert step_seed(1, 3, 0) == step_seed(1, 3, 0) != step_seed(2, 3, 0)


def test_balanced_split_evens_the_ranks_tokens_within_each_mini_batch() -> None:
    """actor.balance_batch: each mini-batch's rows go to the ranks longest first, each rank taking
    its equal share; the mini-batches keep their rows, so the update is the same
    (test_grpo_math_scaling: any split of a mini-batch gives its gradient)."""
    lengths = [100, 90, 10, 5, 80, 4, 3, 2, 50, 50, 50, 50, 1, 1, 1, 1]
    shards = dp_row_split(16, num_mini_batches=2, dp_size=2, lengths=lengths)
    assert shards == [[0, 2, 3, 5, 8, 10, 12, 14], [1, 4, 6, 7, 9, 11, 13, 15]]
    for mini in (range(0, 8), range(8, 16)):
        totals = [sum(lengths[i] for i in shard if i in mini) for shard in shards]
        assert [sum(1 for i in shard if i in mini) for shard in shards] == [4, 4]
        slices = [sum(lengths[i] for i in mini[r * 4 : (r + 1) * 4]) for r in range(2)]
        assert max(totals) - min(totals) <= max(slices) - min(slices)
    assert [sum(lengths[i] for i in s) for s in shards] == [221, 277]  # 405 and 93 as slices
    assert dp_row_split(16, num_mini_batches=2, dp_size=1, lengths=lengths) == [list(range(16))]
    with pytest.raises(ValueError, match="3 row lengths for 16 rows"):
        dp_row_split(16, num_mini_batches=2, dp_size=2, lengths=[1, 2, 3])
