"""GSM8K-style reward: the number after the first `#### ` in the response equals the ground truth
(commas and `$` dropped; numerically equal also counts, e.g. "18.0" for "18"). No "####": 0."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from grpo_trainer.rewards.registry import register

GSM8K_SOURCES = ("openai/gsm8k",)
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_gsm8k_answer(solution_str: str) -> str | None:
    match = _ANSWER.search(solution_str)
    return None if match is None else match.group(1).replace(",", "").replace("$", "").rstrip(".")


def _clean(value: Any) -> str:
    text = str(value).strip()
    if "####" in text:  # a raw GSM8K solution as ground truth
        text = text.split("####")[-1]
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


@register(*GSM8K_SOURCES)
def gsm8k_score(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    answer = extract_gsm8k_answer(solution_str)
    if answer is None:
        return 0.0
    gold = _clean(ground_truth)
    if answer == gold:
        return 1.0
    try:
        return 1.0 if math.isclose(float(answer), float(gold), rel_tol=1e-9, abs_tol=1e-9) else 0.0
    except ValueError:
        return 0.0
