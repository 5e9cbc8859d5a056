"""GSM8K reward. Grader "verl" (the default), verl's `gsm8k.compute_score` (strict): within the
last 300 characters, the last `#### <number>` with commas dropped equals the ground truth as
written (`#### 72.0` for "72" scores 0); no `####`: 0. Grader "lenient": the first `#### ` number
also counts when numerically equal ("72.0" for "72"), and a raw GSM8K solution as ground truth is
read after its `####`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from grpo_trainer.rewards.registry import register

GSM8K_SOURCES = ("openai/gsm8k",)
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_TAIL_CHARS = 300  # verl reads only the end of a response (a 300-token answer fits)


@register(*GSM8K_SOURCES)
def gsm8k_score(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    answers = _ANSWER.findall(solution_str[-_TAIL_CHARS:])
    if not answers:
        return 0.0
    return 1.0 if answers[-1].replace(",", "").replace("$", "") == ground_truth else 0.0


def extract_gsm8k_answer(solution_str: str) -> str | None:
    match = _ANSWER.search(solution_str)
    return None if match is None else match.group(1).replace(",", "").replace("$", "").rstrip(".")


def _clean(value: Any) -> str:
    text = str(value).strip()
    if "####" in text:  # a raw GSM8K solution as ground truth
        text = text.split("####")[-1]
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


@register(*GSM8K_SOURCES, grader="lenient")
def gsm8k_score_lenient(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
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
