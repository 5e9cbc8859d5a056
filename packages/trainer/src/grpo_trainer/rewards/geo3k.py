"""Geometry3k reward (verl's `geo3k.compute_score`): 0.9 x accuracy of the boxed answer + 0.1 x
format, the format being a `<think>...</think>` block followed by a `\\boxed{...}` answer.

Grader "verl" (the default) grades as verl does, with mathruler's `extract_boxed_content` and
`grade_answer` (sympy-based: `\\sqrt{12}` equals `2\\sqrt{3}`, `5.333333` does not equal
`\\frac{16}{3}`). Grader "lenient" grades the last box with grpo's broader matching
(`math_answer.answers_match`: numeric closeness, math-verify when installed). mathruler is imported
at the first "verl" grade: a machine without it fails there, naming reward.grader (`registry`)."""

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


def _combine(accuracy: float, solution_str: str) -> float:
    return (1.0 - FORMAT_WEIGHT) * accuracy + FORMAT_WEIGHT * float(format_ok(solution_str))


@register(*GEO3K_SOURCES, requires=("mathruler", "pylatexenc", "sympy"))
def geo3k_score(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    from mathruler.grader import extract_boxed_content, grade_answer

    accuracy = 1.0 if grade_answer(extract_boxed_content(solution_str), ground_truth) else 0.0
    return _combine(accuracy, solution_str)


@register(*GEO3K_SOURCES, grader="lenient")
def geo3k_score_lenient(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    answer = last_boxed(solution_str)
    accuracy = 1.0 if answer is not None and answers_match(answer, ground_truth) else 0.0
    return _combine(accuracy, solution_str)
