"""Micro-batches for the Megatron schedules: row groups (by count or by a padded-token budget),
and column trimming / padding (sequence parallelism needs a length divisible by TP; pipeline
stages exchange one fixed shape)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_trainer.protocols import PolicyBatch


def row_groups(lengths: list[int], *, micro_batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """Row indices of each micro-batch: consecutive chunks of `micro_batch_size`, or with
    `max_tokens`, rows (longest first) packed so that rows x longest row <= max_tokens."""
    if micro_batch_size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {micro_batch_size}")
    if max_tokens is None:
        return [
            list(range(s, min(s + micro_batch_size, len(lengths))))
            for s in range(0, len(lengths), micro_batch_size)
        ]
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        width = max(longest, lengths[index])
        if current and width * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, width = [], lengths[index]
        current.append(index)
        longest = width
    if current:
        groups.append(current)
    return groups


def map_columns(batch: PolicyBatch, fn: Callable[[torch.Tensor], torch.Tensor]) -> PolicyBatch:
    """Apply `fn` to every per-token [B, T] tensor of the batch."""

    def per_token(t: torch.Tensor | None) -> torch.Tensor | None:
        return fn(t) if t is not None and t.dim() == 2 else t

    return PolicyBatch(
        input_ids=fn(batch.input_ids),
        attention_mask=fn(batch.attention_mask),
        response_mask=fn(batch.response_mask),
        advantages=per_token(batch.advantages),
        old_log_probs=per_token(batch.old_log_probs),
        ref_log_probs=per_token(batch.ref_log_probs),
        extra=batch.extra,
    )


def take_rows(batch: PolicyBatch, rows: list[int], *, width: int, multiple: int = 1) -> PolicyBatch:
    """Rows `rows`, cut to `width` columns, then right-padded to a multiple of `multiple`."""
    index = torch.tensor(rows, dtype=torch.long)
    pad = -width % multiple

    def rows_only(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, index.to(t.device))

    picked = PolicyBatch(
        input_ids=rows_only(batch.input_ids),
        attention_mask=rows_only(batch.attention_mask),
        response_mask=rows_only(batch.response_mask),
        advantages=rows_only(batch.advantages),
        old_log_probs=rows_only(batch.old_log_probs),
        ref_log_probs=rows_only(batch.ref_log_probs),
        extra=batch.extra,
    )
    return map_columns(picked, lambda t: torch.nn.functional.pad(t[:, :width], (0, pad)))


def split_micro_batches(
    batch: PolicyBatch, *, micro_batch_size: int, max_tokens: int | None, same_width: bool, multiple: int = 1
) -> tuple[list[PolicyBatch], list[list[int]]]:
    """Micro-batches and the batch rows each holds. Each is cut to its longest row, or with
    `same_width` all to the longest row of the batch (pipeline parallelism)."""
    lengths = [int(n) for n in batch.attention_mask.sum(dim=-1).tolist()]
    groups = row_groups(lengths, micro_batch_size=micro_batch_size, max_tokens=max_tokens)
    batch_width = max(max(lengths, default=1), 1)
    micros = []
    for group in groups:
        width = batch_width if same_width else max(max(lengths[i] for i in group), 1)
        micros.append(take_rows(batch, group, width=width, multiple=multiple))
    return micros, groups
