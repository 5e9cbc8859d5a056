"""The built-in verifiable task of the tiny preset (data_source "grpo/tiny").

The derivation: docs/INTERNALS.md, `grpo_tiny.task`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA_SOURCE = "grpo/tiny"
DIGITS = "0123456789"
VERBS = ("repeat", "say", "echo", "copy")
# The tiny preset's `reward.custom_fn`: `score` below.
SCORE_FN = "grpo_tiny.task:score"


def score(solution_str: str, ground_truth: str, extra_info: Mapping[str, Any] | None = None) -> float:
    """Share of non-blank characters of `solution_str` equal to the one-character `ground_truth`."""
    del extra_info
    target = str(ground_truth).strip()
    if len(target) != 1:
        raise ValueError(f"grpo/tiny ground truth must be one character, got {ground_truth!r}")
    chars = [c for c in solution_str if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c == target for c in chars) / len(chars)


def make_rows(*, count: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`count` verl-format rows (chat `prompt`, `reward_model.ground_truth`, `data_source`)."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        digit = rng.choice(DIGITS)
        verb = rng.choice(VERBS)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{verb} {digit}"}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def corpus() -> list[str]:
    """Text the tiny tokenizer is trained on: every prompt form plus the answers."""
    lines = [f"{verb} {digit}" for verb in VERBS for digit in DIGITS]
    lines += [" ".join(DIGITS), DIGITS, "the answer is"]
    return lines


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
