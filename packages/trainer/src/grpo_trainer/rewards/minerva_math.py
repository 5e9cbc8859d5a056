"""The answer check verl scores DAPO-Math (`math_dapo`, `math`, `math_dapo_reasoning`, `aime*`)
with (`verl.utils.reward_score.math_dapo`, Minerva's normalisation): within the last 300
characters of the response, the last `Answer: ...` line, normalised, against the normalised ground
truth; without one, the last `\\boxed{...}` of the last 100 characters against the ground truth as
written. +1.0 when correct, -1.0 otherwise (DAPO's reward), with `acc` and the prediction. Written
here to give verl's scores exactly (packages/trainer/tests/data/verl_rewards/math_dapo.jsonl)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grpo_trainer.rewards.braces import closing_brace

INVALID = "[INVALID]"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# Minerva's normalisation tables (lm-evaluation-harness, as verl's math_dapo has them).
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
    ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_PATTERNS = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)


def normalize_final_answer(answer: str) -> str:
    answer = answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for removed in _REMOVED:
        answer = answer.replace(removed, "")
    for pattern, replacement in _PATTERNS:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _last_braced_box(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    end = closing_brace(text, start)
    return None if end is None else text[start + len("\\boxed{") : end]


def check(solution_str: str, ground_truth: str) -> tuple[bool, str]:
    """(correct, the prediction), from the last 300 characters of the response."""
    tail = solution_str[-300:]
    lines = _ANSWER_LINE.findall(tail)
    prediction = normalize_final_answer(lines[-1] if lines else INVALID)
    expected = normalize_final_answer(ground_truth)  # first, as verl: a ground truth that is no text raises
    if prediction != INVALID:
        return prediction == expected, prediction
    boxed = _last_braced_box(tail[-100:])
    if boxed is not None:
        return boxed == ground_truth, boxed
    return prediction == expected, prediction  # verl's: a ground truth "[INVALID]" matches no answer


def minerva_math_score(
    solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    correct, prediction = check(solution_str, ground_truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": prediction}
