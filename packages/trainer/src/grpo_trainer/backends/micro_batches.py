"""Splitting a right-padded batch into micro-batches, by row count or by a padded-token budget."""

from __future__ import annotations

from grpo_trainer.protocols import PolicyBatch


def split_by_count(num_rows: int, *, size: int) -> list[list[int]]:
    """Consecutive chunks of `size` rows (the last may be smaller)."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    return [list(range(start, min(start + size, num_rows))) for start in range(0, num_rows, size)]


def split_by_tokens(lengths: list[int], *, max_tokens: int) -> list[list[int]]:
    """Group rows so that rows x longest row stays within `max_tokens` (the cost once padded).

    Rows are taken longest first so that similar lengths share a micro-batch (less padding); a row
    longer than the budget gets a micro-batch of its own. Deterministic for equal inputs."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        width = max(longest, lengths[index])
        if current and width * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, width = [], lengths[index]
        current.append(index)
        longest = width
    if current:
        groups.append(current)
    return groups


def plan_micro_batches(
    batch: PolicyBatch, *, use_dynamic_bsz: bool, micro_batch_size: int, max_token_len: int
) -> list[list[int]]:
    """Row indices of each micro-batch of `batch`."""
    num_rows = batch.input_ids.shape[0]
    if num_rows == 0:
        return []
    if use_dynamic_bsz:
        lengths = batch.attention_mask.sum(dim=-1).tolist()
        return split_by_tokens([int(n) for n in lengths], max_tokens=max_token_len)
    return split_by_count(num_rows, size=micro_batch_size)
