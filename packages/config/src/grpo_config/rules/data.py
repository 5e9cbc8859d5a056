"""The `data` section's ranges (its batch sizes against the layout: `rules/layout.py`)."""

from __future__ import annotations

from grpo_config.rules.common import Range, range_problems
from grpo_config.schema import TrainerConfig

RANGES: tuple[Range, ...] = (
    ("data.max_prompt_length", lambda v: v >= 1, ">= 1 tokens"),
    ("data.max_response_length", lambda v: v >= 1, ">= 1 tokens"),
    ("data.gen_batch_size", lambda v: v is None or v >= 1, ">= 1 prompts or null (data.train_batch_size)"),
)


def data_problems(cfg: TrainerConfig) -> list[str]:
    return range_problems(cfg, RANGES)
