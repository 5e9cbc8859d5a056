"""The MATH answer check verl scores lighteval/MATH, MATH-lighteval and MATH-500 with
(`verl.utils.reward_score.math_reward`, itself the Hendrycks MATH / lm-evaluation-harness
normalisation): the last `\\boxed{...}` (or `\\boxed x`, `\\fbox{...}`) of the response against the
ground truth, both normalised as strings; 1.0 when equal, else 0.0. Written here to give verl's
scores exactly (packages/trainer/tests/data/verl_rewards/math.jsonl); the rules and their quirks are verl's, e.g.
`0.5` equals `\\frac{1}{2}` but `0.25` does not equal `\\frac{1}{4}`, and a normalisation that fails
falls back to comparing the raw strings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_trainer.rewards.braces import closing_brace


def last_box(text: str) -> str | None:
    """The last box with its command (`\\boxed{...}`, `\\boxed x` up to a `$`, or `\\fbox{...}`)."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    end = closing_brace(text, start)
    return None if end is None else text[start : end + 1]


class BoxError(ValueError):
    """A box that is not `\\boxed{...}` / `\\boxed x` (an `\\fbox`): verl's check scores it 0."""


def box_content(box: str) -> str:
    if "\\boxed " in box:
        if not box.startswith("\\boxed "):
            raise BoxError(box)
        return box[len("\\boxed ") :]
    if not (box.startswith("\\boxed{") and box.endswith("}")):
        raise BoxError(box)
    return box[len("\\boxed{") : -1]


def _fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{x}` -> `\\frac{1}{x}`; raises on a bare trailing `\\frac`."""
    head, *pieces = text.split("\\frac")
    out = [head]
    for piece in pieces:
        out.append("\\frac")
        if piece[0] == "{":  # IndexError on an empty piece, as verl's
            out.append(piece)
            continue
        if len(piece) < 2:
            return text
        first, second, rest = piece[0], piece[1], piece[2:]
        out.append(f"{{{first}}}{{{second}}}{rest}" if second != "{" else f"{{{first}}}{second}{rest}")
    return "".join(out)


def _slash_fraction(text: str) -> str:
    """`3/4` -> `\\frac{3}{4}` for two plain integers written canonically; anything else as it is."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        numerator, denominator = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    if text != f"{numerator}/{denominator}":
        return text
    return f"\\frac{{{numerator}}}{{{denominator}}}"


def _without_units(text: str) -> str:
    """Cut a `\\text{ unit}` on the right; more than one such unit is an error (verl asserts)."""
    if "\\text{ " not in text:
        return text
    parts = text.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError(f"more than one unit in {text!r}")
    return parts[0]


def _sqrts(text: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}`; raises on a bare trailing `\\sqrt`."""
    if "\\sqrt" not in text:
        return text
    head, *pieces = text.split("\\sqrt")
    return head + "".join(
        f"\\sqrt{piece}" if piece[0] == "{" else f"\\sqrt{{{piece[0]}}}{piece[1:]}" for piece in pieces
    )


def normalize(text: str) -> str:
    """The Hendrycks MATH normal form of an answer (may raise: the caller compares raw strings)."""
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        text = text.replace(old, new)
    text = _without_units(text)
    text = text.replace("\\\\%", "").replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5" -> " 5"
        text = sides[1]
    text = _sqrts(text).replace(" ", "")
    text = _fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_fraction(text)


def equivalent(answer: str | None, ground_truth: str | None) -> bool:
    if answer is None or ground_truth is None:
        return answer is None and ground_truth is None
    try:
        return normalize(answer) == normalize(ground_truth)
    except Exception:  # verl falls back to the raw strings on any failure
        return answer == ground_truth


def hendrycks_math_score(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None) -> float:
    try:
        box = last_box(solution_str)
        return 1.0 if box is not None and equivalent(box_content(box), ground_truth) else 0.0
    except Exception:  # verl scores any failure of the check 0
        return 0.0
