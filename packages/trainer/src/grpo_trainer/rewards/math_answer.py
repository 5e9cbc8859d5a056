"""Rule-based math answers: the last `\\boxed{...}` of a response, compared with the ground truth
(grader "lenient"); the data sources' default, verl-equal checks are `hendrycks_math` (MATH) and
`minerva_math` (DAPO-Math, AIME).

Equivalence uses math-verify (symbolic) when it is importable, else (and in addition) a
normalised string comparison with a numeric check. math-verify's own signal-based timeouts are
off: the reward manager enforces the timeout around the whole call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from grpo_trainer.rewards.braces import closing_brace
from grpo_trainer.rewards.hendrycks_math import hendrycks_math_score
from grpo_trainer.rewards.minerva_math import minerva_math_score
from grpo_trainer.rewards.registry import register

try:  # imported here, not on first call, so its import time never counts against a timeout
    import math_verify as _math_verify
except ImportError:
    _math_verify = None

MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def math_verify_available() -> bool:
    return _math_verify is not None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`), braces balanced."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    rest = rest[len("\\boxed") :] if rest.startswith("\\boxed") else rest[len("\\fbox") :]
    if rest.startswith(" "):  # "\boxed 5": the answer runs to the next "$" or whitespace
        match = re.match(r" +([^\s$]+)", rest)
        return match.group(1) if match else None
    if not rest.startswith("{"):
        return None
    end = closing_brace(rest, 0)
    return None if end is None else rest[1:end]


_UNWRAP = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\{([^{}]*)\}")
_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\$", "$", "\\%", "%")


def _brace_short_args(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{x} -> \frac{1}{x}, \sqrt2 -> \sqrt{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    return re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)


def normalize_answer(answer: Any) -> str:
    """A canonical string for comparing final answers (units, spacing, LaTeX variants removed)."""
    s = str(answer).strip()
    boxed = last_boxed(s)
    if boxed is not None:
        s = boxed
    s = s.replace("\n", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\^\{?\\circ\}?", "", s)
    for _ in range(3):  # nested \text{\textbf{...}}
        s = _UNWRAP.sub(r"\1", s)
    for token in _REMOVE:
        s = s.replace(token, "")
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"[A-Za-z]\w?=.+", s):  # "x=5" -> "5"
        s = s.split("=", 1)[1]
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # 1,000 -> 1000
        s = s.replace(",", "")
    s = _brace_short_args(s)
    s = re.sub(r"^(-?)\.(\d)", r"\g<1>0.\2", s)  # .5 -> 0.5
    simple_fraction = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if simple_fraction:
        s = f"\\frac{{{simple_fraction.group(1)}}}{{{simple_fraction.group(2)}}}"
    return s


def _numeric_value(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        pass
    frac = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if frac and int(frac.group(3)) != 0:
        value = int(frac.group(2)) / int(frac.group(3))
        return -value if frac.group(1) else value
    return None


def _math_verify_equal(prediction: str, ground_truth: str) -> bool:
    if _math_verify is None:
        return False
    try:
        gold = _math_verify.parse(f"${ground_truth}$", parsing_timeout=None)
        pred = _math_verify.parse(f"${prediction}$", parsing_timeout=None)
        return bool(gold and pred and _math_verify.verify(gold, pred, timeout_seconds=None))
    except Exception:  # math-verify raises on odd LaTeX; the string comparison still decides
        return False


def answers_match(prediction: str, ground_truth: Any, *, use_math_verify: bool = True) -> bool:
    """Whether a final answer equals the ground truth (string-normalised, numeric or symbolic)."""
    pred, gold = normalize_answer(prediction), normalize_answer(ground_truth)
    if pred == gold:
        return True
    pv, gv = _numeric_value(pred), _numeric_value(gold)
    if pv is not None and gv is not None:
        return math.isclose(pv, gv, rel_tol=1e-6, abs_tol=1e-9)
    return use_math_verify and _math_verify_equal(prediction, str(ground_truth))


# verl's scoring of the MATH sources (the default grader) and of DAPO-Math and AIME.
register(*MATH_SOURCES)(hendrycks_math_score)
register(*DAPO_SOURCES)(minerva_math_score)
register("aime", prefix=True)(minerva_math_score)


@register(*MATH_SOURCES, *DAPO_SOURCES, grader="lenient")
@register("aime", grader="lenient", prefix=True)
def math_score(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    """Grader "lenient": 1.0 when the last boxed answer matches the ground truth by grpo's broader
    matching, else 0.0 (no box: 0.0)."""
    answer = last_boxed(solution_str)
    return 1.0 if answer is not None and answers_match(answer, ground_truth) else 0.0
