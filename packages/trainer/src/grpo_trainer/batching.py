"""The one batching path: rollouts -> a padded policy batch -> rows per data-parallel rank ->
mini-batches -> micro-batches, and the micro-batches' outputs back into batch order. Both policy
backends receive the micro-batches made here and nothing else.

The derivation: docs/INTERNALS.md, `grpo_trainer.batching`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo_config.schema import TrainerConfig
from grpo_trainer.protocols import Generation, PolicyBatch


def response_budget(cfg: TrainerConfig) -> int:
    """The most tokens a response may have: `rollout.max_tokens`, else `data.max_response_length`."""
    return cfg.rollout.max_tokens or cfg.data.max_response_length


def pad_rows(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    rollout_log_probs: Sequence[Sequence[float]] | None = None,
    masks: Sequence[Sequence[int] | None] | None = None,
) -> PolicyBatch:
    """Right-padded `PolicyBatch` of `prompt_i + response_i` rows (no advantages yet). `masks[i]`
    (a multi-turn response's `Generation.mask`) keeps only its sampled ids in `response_mask`."""
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
        mask = masks[i] if masks is not None else None
        if mask is None:
            response_mask[i, p : p + r] = 1.0
        elif len(mask) != r:
            raise ValueError(f"response {i} has {r} ids but a mask of {len(mask)}")
        else:
            response_mask[i, p : p + r] = torch.tensor(mask, dtype=torch.float32)
        if rollout_log_probs is not None:
            rollout_lp[i, p : p + r] = torch.tensor(rollout_log_probs[i], dtype=torch.float32)
    return PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        rollout_log_probs=rollout_lp if rollout_log_probs is not None else None,
    )


def pad_generations(
    prompts: Sequence[Sequence[int]], generations: Sequence[Generation], *, pad_token_id: int
) -> PolicyBatch:
    """`pad_rows` of the engines' generations: their ids, log-probs and (multi-turn) masks."""
    return pad_rows(
        prompts,
        [g.token_ids for g in generations],
        pad_token_id=pad_token_id,
        rollout_log_probs=[g.logprobs for g in generations],
        masks=[g.mask for g in generations],
    )


def dp_row_split(
    num_rows: int, *, num_mini_batches: int, dp_size: int, lengths: Sequence[int] | None = None
) -> list[list[int]]:
    """Row indices per data-parallel rank: mini-batch m (rows [m*M, (m+1)*M)) gives each rank M/dp of
    its rows; a rank's rows are its share of mini-batch 0, 1, ... in order. Without `lengths` rank r
    takes the r-th slice; with them (each row's tokens: `actor.balance_batch`) the rows of each
    mini-batch go to the ranks so that their token totals are as equal as a greedy longest-first
    assignment makes them. The mini-batches keep their rows either way, and the loss is normalised
    over the whole mini-batch, so balancing changes which rank computes a row, not the update."""
    if num_mini_batches < 1 or dp_size < 1:
        raise ValueError(f"need num_mini_batches >= 1 and dp_size >= 1, got {num_mini_batches}, {dp_size}")
    if num_rows % (num_mini_batches * dp_size):
        raise ValueError(
            f"{num_rows} sequences do not split into {num_mini_batches} mini-batches x {dp_size} ranks; "
            "make data.train_batch_size * rollout.n divisible by (mini-batches x data-parallel size)"
        )
    mini = num_rows // num_mini_batches
    per_rank = mini // dp_size
    if lengths is None or dp_size == 1:
        return [
            [m * mini + r * per_rank + j for m in range(num_mini_batches) for j in range(per_rank)]
            for r in range(dp_size)
        ]
    if len(lengths) != num_rows:
        raise ValueError(f"{len(lengths)} row lengths for {num_rows} rows")
    shards: list[list[int]] = [[] for _ in range(dp_size)]
    for m in range(num_mini_batches):
        rows = sorted(range(m * mini, (m + 1) * mini), key=lambda i: (-lengths[i], i))
        taken = [0] * dp_size
        tokens = [0] * dp_size
        share: list[list[int]] = [[] for _ in range(dp_size)]
        for i in rows:
            rank = min((r for r in range(dp_size) if taken[r] < per_rank), key=lambda r: (tokens[r], r))
            share[rank].append(i)
            taken[rank] += 1
            tokens[rank] += lengths[i]
        for rank in range(dp_size):
            shards[rank].extend(sorted(share[rank]))
    return shards


def rank_shards(cfg: TrainerConfig, batch: PolicyBatch, dp_size: int) -> list[list[int]]:
    """The rows each data-parallel rank trains on: its share of every mini-batch, balanced by
    token count with actor.balance_batch."""
    return dp_row_split(
        batch.input_ids.shape[0],
        num_mini_batches=cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size,
        dp_size=dp_size,
        lengths=row_lengths(batch) if cfg.actor.balance_batch else None,
    )


def mini_batch_rows(num_rows: int, num_mini_batches: int) -> list[list[int]]:
    """A rank's rows as `num_mini_batches` consecutive equal blocks (its slice of each mini-batch)."""
    if num_mini_batches < 1 or num_rows % num_mini_batches:
        raise ValueError(f"{num_rows} local rows do not split into {num_mini_batches} mini-batches")
    per = num_rows // num_mini_batches
    return [list(range(m * per, (m + 1) * per)) for m in range(num_mini_batches)]


def take_rows(
    batch: PolicyBatch, rows: Sequence[int], *, width: int | None = None, multiple: int = 1
) -> PolicyBatch:
    """Rows `rows` of `batch` (every per-row and per-token tensor, extras included), cut to `width`
    columns (default: the longest selected row) and right-padded with zeros to a multiple of
    `multiple`."""
    index = torch.tensor(list(rows), dtype=torch.long)
    if width is None:
        width = (
            max(int(batch.attention_mask.index_select(0, index).sum(dim=-1).max().item()), 1) if rows else 1
        )
    pad = -width % multiple

    def pick(t: Any) -> Any:
        if t is None:
            return None
        if isinstance(t, list):  # per-row values that are not one tensor (vision inputs)
            return [t[i] for i in rows]
        t = t.index_select(0, index.to(t.device))
        if t.dim() != 2:
            return t
        t = t[:, :width]
        return torch.nn.functional.pad(t, (0, pad)) if pad else t

    return PolicyBatch(**{f.name: pick(getattr(batch, f.name)) for f in dataclasses.fields(PolicyBatch)})


def row_lengths(batch: PolicyBatch) -> list[int]:
    return [int(n) for n in batch.attention_mask.sum(dim=-1).tolist()]


def _tokens(lengths: Sequence[int], *, packed: bool) -> int:
    """What a micro-batch of rows of `lengths` computes: rows x the longest row, padded; the
    rows' own tokens, packed (`use_remove_padding`, one padding-free row)."""
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    max_tokens: int | None,
    count: int | None = None,
    packed: bool = False,
) -> list[list[int]]:
    """Row indices of each micro-batch: consecutive chunks of `micro_batch_size` rows, or with
    `max_tokens`, rows (longest first, so that similar lengths share a micro-batch) taken while
    the micro-batch's tokens (`_tokens`: padded or `packed`) stay <= max_tokens; a row longer than
    the budget gets a micro-batch of its own.
    With `count`, the token-budget plan is split further (the costliest micro-batch in two, until
    there are `count`): every data-parallel rank must run the same number of micro-batches, since
    the model's collectives (MoE all-to-all, pipeline sends) pair them up. Deterministic."""
    groups = _plan(lengths, micro_batch_size=micro_batch_size, max_tokens=max_tokens, packed=packed)
    if count is None or count == len(groups):
        return groups
    if count < len(groups) or count > len(lengths):
        raise ValueError(
            f"cannot cut {len(lengths)} rows planned as {len(groups)} micro-batches into {count}"
        )
    while len(groups) < count:
        at = max(
            (k for k, group in enumerate(groups) if len(group) > 1),
            key=lambda k: (_tokens([lengths[i] for i in groups[k]], packed=packed), -k),
        )
        half = len(groups[at]) // 2
        groups[at : at + 1] = [groups[at][:half], groups[at][half:]]
    return groups


def _plan(
    lengths: Sequence[int], *, micro_batch_size: int, max_tokens: int | None, packed: bool
) -> list[list[int]]:
    if max_tokens is None:
        if micro_batch_size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {micro_batch_size}")
        return [
            list(range(start, min(start + micro_batch_size, len(lengths))))
            for start in range(0, len(lengths), micro_batch_size)
        ]
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if current and _tokens([lengths[i] for i in (*current, index)], packed=packed) > max_tokens:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


@dataclass(frozen=True, kw_only=True)
class MicroBatchShape:
    """What the policy's parallel layout asks of micro-batch shapes. `same_width`: every micro-batch
    padded to the longest row of the batch (pipeline stages exchange one fixed activation shape);
    `multiple`: lengths rounded up to a multiple (sequence parallelism splits the sequence over TP)."""

    same_width: bool = False
    multiple: int = 1

    @classmethod
    def for_config(cls, cfg: TrainerConfig) -> MicroBatchShape:
        if cfg.actor.backend != "megatron":
            return cls()
        par = cfg.parallel
        return cls(same_width=par.pp > 1, multiple=par.tp if par.sequence_parallel else 1)


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    rows: list[int]  # indices into the batch it was cut from
    batch: PolicyBatch


def micro_batches(
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
    max_tokens: int | None,
    shape: MicroBatchShape = MicroBatchShape(),
    count: int | None = None,
    packed: bool = False,
) -> list[MicroBatch]:
    """`batch` cut into micro-batches (see `plan_micro_batches` and `MicroBatchShape`)."""
    lengths = row_lengths(batch)
    groups = plan_micro_batches(
        lengths, micro_batch_size=micro_batch_size, max_tokens=max_tokens, count=count, packed=packed
    )
    batch_width = max(max(lengths, default=1), 1)
    out = []
    for group in groups:
        width = batch_width if shape.same_width else max(max(lengths[i] for i in group), 1)
        out.append(
            MicroBatch(rows=group, batch=take_rows(batch, group, width=width, multiple=shape.multiple))
        )
    return out


def scatter_rows(
    parts: Sequence[tuple[Sequence[int], torch.Tensor]], *, num_rows: int, width: int
) -> torch.Tensor:
    """A float32 `[num_rows, width]` tensor with each part's `[len(rows), w]` values written at its
    rows (columns beyond `width` dropped, missing ones zero): micro-batch outputs in batch order."""
    out = torch.zeros(num_rows, width, dtype=torch.float32)
    for rows, values in parts:
        cols = min(width, values.shape[1])
        out[torch.tensor(list(rows), dtype=torch.long), :cols] = values[:, :cols].float().cpu()
    return out
