"""Turning one step's rollouts into padded policy batches and splitting them over ranks.

Row layout (right-padded): `prompt + response + pad`; `response_mask` covers the response tokens
(EOS included when generated). Mini-batches are consecutive blocks of the step's sequences (whole
groups when `ppo_mini_batch_size` counts prompts); each mini-batch is split evenly over the
data-parallel ranks, so every rank holds the same number of mini-batches, of equal size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpo_trainer.protocols import PolicyBatch


def pad_rows(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    rollout_log_probs: Sequence[Sequence[float]] | None = None,
) -> PolicyBatch:
    """Right-padded `PolicyBatch` of `prompt_i + response_i` rows (no advantages yet)."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    width = max((len(p) + len(r) for p, r in zip(prompts, responses, strict=True)), default=1)
    rows = len(prompts)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.float32)
    rollout_lp = torch.zeros((rows, width), dtype=torch.float32)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        p, r = len(prompt), len(response)
        input_ids[i, : p + r] = torch.tensor([*prompt, *response], dtype=torch.long)
        attention_mask[i, : p + r] = 1
        response_mask[i, p : p + r] = 1.0
        if rollout_log_probs is not None:
            rollout_lp[i, p : p + r] = torch.tensor(rollout_log_probs[i], dtype=torch.float32)
    extra = {} if rollout_log_probs is None else {"rollout_log_probs": rollout_lp}
    return PolicyBatch(
        input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, extra=extra
    )


def dp_row_split(num_rows: int, *, num_mini_batches: int, dp_size: int) -> list[list[int]]:
    """Row indices per rank: mini-batch m (rows [m*M, (m+1)*M)) gives rank r its r-th slice;
    a rank's rows are its slices of mini-batch 0, 1, ... in order."""
    if num_mini_batches < 1 or dp_size < 1:
        raise ValueError(f"need num_mini_batches >= 1 and dp_size >= 1, got {num_mini_batches}, {dp_size}")
    if num_rows % (num_mini_batches * dp_size):
        raise ValueError(
            f"{num_rows} sequences do not split into {num_mini_batches} mini-batches x {dp_size} ranks; "
            "make data.train_batch_size * rollout.n divisible by (mini-batches x data-parallel size)"
        )
    mini = num_rows // num_mini_batches
    per_rank = mini // dp_size
    return [
        [m * mini + r * per_rank + j for m in range(num_mini_batches) for j in range(per_rank)]
        for r in range(dp_size)
    ]


def take_rows(batch: PolicyBatch, rows: Sequence[int]) -> PolicyBatch:
    """The rows `rows` of `batch`, cut to their longest row (all per-token tensors and extras)."""
    index = torch.tensor(list(rows), dtype=torch.long)
    width = max(int(batch.attention_mask.index_select(0, index).sum(dim=-1).max().item()), 1) if rows else 1

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.index_select(0, index)
        return t[:, :width] if t.dim() == 2 else t

    return PolicyBatch(
        input_ids=pick(batch.input_ids),
        attention_mask=pick(batch.attention_mask),
        response_mask=pick(batch.response_mask),
        advantages=pick(batch.advantages),
        old_log_probs=pick(batch.old_log_probs),
        ref_log_probs=pick(batch.ref_log_probs),
        extra={k: pick(v) if isinstance(v, torch.Tensor) else v for k, v in batch.extra.items()},
    )
