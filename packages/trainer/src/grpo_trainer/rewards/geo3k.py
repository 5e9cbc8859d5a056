"""Geometry3k-style reward (verl's geo3k): 0.9 x accuracy of the last boxed answer + 0.1 x format,
where the format is a `<think>...</think>` block followed by a `\\boxed{...}` answer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grpo_trainer.rewards.math_answer import answers_match, last_boxed
from grpo_trainer.rewards.registry import register

GEO3K_SOURCES = ("hiyouga/geometry3k",)
FORMAT_WEIGHT = 0.1
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_ok(solution_str: str) -> bool:
    return _FORMAT.fullmatch(solution_str) is not None


@register(*GEO3K_SOURCES)
def geo3k_score(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    answer = last_boxed(solution_str)
    accuracy = 1.0 if answer is not None and answers_match(answer, ground_truth) else 0.0
    return (1.0 - FORMAT_WEIGHT) * accuracy + FORMAT_WEIGHT * float(format_ok(solution_str))
