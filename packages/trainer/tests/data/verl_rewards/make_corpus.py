#!/usr/bin/env python3
"""Build the verl reward differential corpus in this directory.

Every row is scored by verl's own reward function, loaded as a single module file from a
verl checkout (``--verl-src DIR``, the directory that holds ``verl/utils/reward_score/``).
verl's package ``__init__`` is never imported, so verl itself need not be installed; only
``mathruler`` (geo3k) and its import-time dependencies (sympy, pylatexenc, tqdm) are needed.

The case rows are built deterministically (no randomness): the same script with the same
verl source and the same mathruler / sympy / pylatexenc versions writes identical files.

    python make_corpus.py --verl-src /tmp/verl_src [--out DIR] [--only geo3k,gsm8k,math,math_dapo]

Output: ``<source>.jsonl``, one JSON object a line:
``{"case": ..., "solution_str": ..., "ground_truth": ..., "score": float|null}``; math_dapo rows
also carry ``"acc"`` (bool) and ``"pred"`` (verl's normalized prediction).  A row whose verl call
raised carries ``"score": null`` and ``"error": <exception type name>``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent

# corpus name -> verl module file under verl/utils/reward_score/
MODULE_FILES = {
    "geo3k": "geo3k.py",
    "gsm8k": "gsm8k.py",
    "math": "math_reward.py",
    "math_dapo": "math_dapo.py",
}

ROW_TIMEOUT_S = 30  # guard against a sympy hang in mathruler; verl itself has none

Row = tuple[str, str, str]  # (case tag, solution_str, ground_truth)


# --------------------------------------------------------------------------------------------
# shared text pieces (plain prose; none of them contains "answer:" or "####" or "\boxed")
# --------------------------------------------------------------------------------------------

GEO_REASON = [
    "In the right triangle, the side opposite the 60 degree angle is the longer leg. "
    "Using the ratio of the sides we can set up an equation and solve for x.",
    "The two chords intersect inside the circle, so the products of their segments are equal. "
    "Solving the resulting linear equation gives the value of x.",
    "Since the quadrilateral is a parallelogram, opposite sides are congruent. "
    "Setting the expressions equal and simplifying gives the unknown.",
    "The area of the sector is the fraction of the circle given by the central angle, "
    "times pi r squared. Plugging in the radius and the angle gives the result.",
    "By the Pythagorean theorem, the hypotenuse squared equals the sum of the squares of the legs. "
    "Taking the square root and simplifying the radical gives the length.",
]

GSM_COT = [
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.",
    "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.",
    "Betty has only 100 / 2 = $<<100/2=50>>50.\nBetty's grandparents gave her 15 * 2 = $<<15*2=30>>30.\n"
    "This means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.",
    "Maila read 12 x 2 = <<12*2=24>>24 pages today.\nSo she was able to read a total of 12 + 24 = <<12+24=36>>36 pages since yesterday.",
    "He writes each friend 3*2=<<3*2=6>>6 pages a week.\nSo he writes 6*2=<<6*2=12>>12 pages every week.\n"
    "That means he writes 12*52=<<12*52=624>>624 pages a year.",
]

MATH_REASON = [
    "We begin by isolating the variable. Subtracting the constant from both sides and dividing "
    "by the coefficient, we obtain the value.",
    "Let us factor the quadratic. The roots follow from setting each factor to zero, "
    "and only one of them satisfies the original constraint.",
    "Using the identity for the sum of a geometric series with first term a and ratio r, "
    "we substitute the given values and simplify the fraction.",
    "Rationalizing the denominator, we multiply the numerator and the denominator by the conjugate "
    "and simplify the radicals carefully.",
    "Counting the cases separately and adding them, then dividing by the size of the sample space, "
    "gives the required probability.",
]

# Each long filler is > 300 characters so that, placed before the answer, it pushes the start of
# the response out of gsm8k's and math_dapo's 300-character window.
LONG_FILLER = [
    "Let me restate the problem to make sure I understand every quantity involved. We are given "
    "several measurements and we have to combine them carefully, keeping track of units at every "
    "step so that nothing is lost in translation. First I will write down what is known, then what "
    "is asked, and finally I will connect the two with the relevant relationships. I will also check "
    "the intermediate results against a rough estimate to catch arithmetic slips.",
    "Okay, so this is a multi-step problem. The first step is to figure out the quantity for the "
    "first period, and then use it to compute the second period. After that we add them up. Hmm, "
    "wait, let me re-read the question to be careful about whether it asks for the total or the "
    "difference. It asks for the total. Good. Now, let me also verify the computation a second way, "
    "by working backwards from the candidate result, to make sure the two methods agree exactly.",
    "We proceed in three stages. In the first stage we simplify the given expression by collecting "
    "like terms and cancelling common factors in the numerator and the denominator. In the second "
    "stage we substitute the known values and evaluate. In the third stage we double-check the "
    "result for consistency with the constraints stated in the problem, including the domain "
    "restrictions and any sign conditions that the variables must satisfy throughout.",
]


def _filler(pool: list[str], k: int) -> str:
    return pool[k % len(pool)]


# --------------------------------------------------------------------------------------------
# solution shapes: wrap a final-answer fragment into a plausible model response
# --------------------------------------------------------------------------------------------


def boxed_shape(shape: str, frag: str, k: int, reason: list[str]) -> str:
    """Shapes for the boxed-answer sources (geo3k, math); ``frag`` is e.g. ``\\boxed{5}``."""
    r = _filler(reason, k)
    long = _filler(LONG_FILLER, k)
    if shape == "short":
        return frag
    if shape == "sentence":
        return f"The answer is ${frag}$."
    if shape == "reason":
        return f"{r}\n\nTherefore, the final answer is {frag}."
    if shape == "think":
        return f"<think>\n{r}\n</think>\n\nThe answer is {frag}."
    if shape == "think_tight":
        return f"<think>{r}</think>{frag}"
    if shape == "long":
        return f"{long}\n\n{r}\n\nSo the final answer is {frag}."
    if shape == "long_think":
        return f"<think>\n{long}\n</think>\n{r}\nThus the answer is {frag}"
    raise ValueError(shape)


def line_shape(shape: str, frag: str, k: int, reason: list[str]) -> str:
    """Shapes for the final-line sources (gsm8k ``#### N``, math_dapo ``Answer: N``)."""
    r = _filler(reason, k)
    long = _filler(LONG_FILLER, k)
    if shape == "short":
        return frag
    if shape == "reason":
        return f"{r}\n{frag}"
    if shape == "think":
        return f"<think>\n{r}\n</think>\n{r}\n{frag}"
    if shape == "long":
        return f"{long}\n{r}\n{frag}"
    if shape == "trailing":
        return f"{r}\n{frag}\n"
    raise ValueError(shape)


BOXED_PLAIN = ["short", "sentence", "reason", "long"]
BOXED_THINK = ["think", "think_tight", "long_think"]
LINE_SHAPES = ["short", "reason", "think", "long", "trailing"]


class Rotor:
    """Deterministic round-robin over a list of shapes."""

    def __init__(self, items: list[str]) -> None:
        self.items = items
        self.i = 0

    def next(self) -> str:
        item = self.items[self.i % len(self.items)]
        self.i += 1
        return item


# --------------------------------------------------------------------------------------------
# geo3k
# --------------------------------------------------------------------------------------------

# ground truth -> candidate boxed contents (equivalent forms first, then wrong ones)
GEO3K_ANSWERS: dict[str, list[str]] = {
    r"2\sqrt{3}": [
        r"2\sqrt{3}",
        r"\sqrt{12}",
        r"2 \sqrt 3",
        r"2\sqrt3",
        "2√3",
        "3.4641016",
        r"2 \cdot \sqrt{3}",
        r"\frac{6}{\sqrt{3}}",
        r"2\sqrt{2}",
        r"\sqrt{3}",
        "3.46",
        r"4\sqrt{3}",
    ],
    r"\frac{16}{3}": [
        r"\frac{16}{3}",
        "16/3",
        r"\dfrac{16}{3}",
        r"\tfrac{16}{3}",
        r"5\frac{1}{3}",
        r"5 \frac{1}{3}",
        "5 1/3",
        "5.333333",
        "5.3333333333",
        "5.33",
        r"\frac{32}{6}",
        "32/6",
        r"\frac{3}{16}",
        "16",
        r"\frac{16}{3} \text{ cm}",
        "１６/３",
    ],
    r"\frac{9\pi}{2}": [
        r"\frac{9\pi}{2}",
        r"4.5\pi",
        r"\frac{9}{2}\pi",
        r"9\pi/2",
        r"\dfrac{9 \pi}{2}",
        "4.5π",
        "9π/2",
        "14.137166941",
        r"\frac{9}{2}",
        r"9\pi",
        r"4.5 \pi \text{ cm}^2",
    ],
    "60": [
        "60",
        r"60^\circ",
        r"60^{\circ}",
        "60 degrees",
        "60°",
        "60.0",
        r"\text{60}",
        r"60 \text{ degrees}",
        r"60\%",
        "６０",
        "30",
        "120",
        r"\frac{\pi}{3}",
    ],
    "12.5": [
        "12.5",
        r"\frac{25}{2}",
        "25/2",
        "12.50",
        r"12\frac{1}{2}",
        r"12.5 \text{ cm}",
        "12.5 cm",
        r"12.5\text{cm}",
        "12.5 centimeters",
        "13",
        "12",
        "125",
    ],
    r"\frac{\sqrt{3}}{2}": [
        r"\frac{\sqrt{3}}{2}",
        r"\sqrt{3}/2",
        r"\frac{\sqrt3}{2}",
        r"\frac{1}{2}\sqrt{3}",
        r"\dfrac{\sqrt{3}}{2}",
        "√3/2",
        "0.8660254",
        "0.866",
        r"\frac{\sqrt{3}}{3}",
        r"\frac{1}{2}",
        r"\sqrt{3}",
    ],
    "5": [
        "5",
        "5.0",
        "5.00",
        r"\text{5}",
        "{5}",
        "x=5",
        "x = 5",
        "5 cm",
        r"5 \text{ cm}",
        r"5\text{ units}",
        "５",
        r"\frac{10}{2}",
        "10/2",
        "6",
        "-5",
        "−5",
    ],
    "-5": ["-5", "−5", "- 5", "-5.0", r"-\frac{10}{2}", "(-5)", "5", "-6"],
    "1000": ["1000", "1,000", "1{,}000", r"1,\!000", r"1\,000", "10^3", "1000.0", "100", "10000"],
    "50": ["50", r"50\%", "50%", r"50 \%", "0.5", r"\frac{1}{2}", "50.0", "5", "500"],
    r"24\sqrt{2}": [r"24\sqrt{2}", r"\sqrt{1152}", r"24 \sqrt 2", "24√2", "33.9411255", r"12\sqrt{2}", "24"],
    r"\frac{1}{3}": [
        r"\frac{1}{3}",
        "1/3",
        r"\dfrac13",
        r"\frac13",
        "0.3333333333",
        "0.333",
        r"\frac{2}{6}",
        "3",
    ],
    "8": ["8", "8.0", "08", r"\sqrt{64}", "2^3", "8 inches", "8 feet", "9", "-8"],
    r"4\sqrt{3}": [r"4\sqrt{3}", r"\sqrt{48}", "4√3", "6.92820323", r"4\sqrt{2}"],
    "72": ["72", "72.0", r"72^\circ", r"\frac{2\pi}{5}", "72 degrees", "27"],
    "2.5": ["2.5", r"\frac{5}{2}", "5/2", r"2\frac{1}{2}", "2.50", "2", "25"],
}


def build_geo3k() -> list[Row]:
    rows: list[Row] = []
    plain, think = Rotor(BOXED_PLAIN), Rotor(BOXED_THINK)
    k = 0
    for gt, answers in GEO3K_ANSWERS.items():
        for ans in answers:
            frag = "\\boxed{" + ans + "}"
            for rot in (plain, think):
                shape = rot.next()
                rows.append((f"{shape}:{ans}", boxed_shape(shape, frag, k, GEO_REASON), gt))
                k += 1

    # several boxes, missing / malformed boxes, nested braces, whitespace
    r = GEO_REASON[0]
    specials: list[tuple[str, str, str]] = [
        (
            "boxes_first_right_last_wrong",
            f"{r}\nSo x is \\boxed{{2\\sqrt{{3}}}}. Wait, recheck: \\boxed{{4}}.",
            r"2\sqrt{3}",
        ),
        (
            "boxes_first_wrong_last_right",
            f"{r}\nSo x is \\boxed{{4}}. Wait, recheck: \\boxed{{2\\sqrt{{3}}}}.",
            r"2\sqrt{3}",
        ),
        (
            "boxes_think_wrong_then_right",
            "<think>\nMaybe \\boxed{4}.\n</think>\nThe answer is \\boxed{2\\sqrt{3}}.",
            r"2\sqrt{3}",
        ),
        (
            "boxes_think_right_then_wrong",
            "<think>\nMaybe \\boxed{2\\sqrt{3}}.\n</think>\nThe answer is \\boxed{4}.",
            r"2\sqrt{3}",
        ),
        ("box_inside_think_only", f"<think>\n{r} So \\boxed{{60}}.\n</think>\nThe answer is 60.", "60"),
        (
            "box_both_inside_and_after_think",
            f"<think>\n{r} So \\boxed{{60}}.\n</think>\nThe answer is \\boxed{{60}}.",
            "60",
        ),
        ("no_box", f"{r}\nThe answer is 60.", "60"),
        ("no_box_think", f"<think>\n{r}\n</think>\nThe answer is 60.", "60"),
        ("no_box_bare", "60", "60"),
        ("no_box_dollars", "The answer is $60$.", "60"),
        ("no_box_gt_None", "The answer is unknown.", "None"),
        ("box_no_braces", "The answer is \\boxed 5.", "5"),
        ("box_no_braces_think", "<think>\nok\n</think>\n\\boxed 5", "5"),
        ("box_space_before_brace", "The answer is \\boxed {5}.", "5"),
        ("box_unclosed", "The answer is \\boxed{5", "5"),
        ("box_unclosed_think", "<think>\nok\n</think>\nThe answer is \\boxed{5", "5"),
        ("box_empty", "The answer is \\boxed{}.", "5"),
        ("box_empty_think", "<think>\nok\n</think>\\boxed{}", "5"),
        ("fbox", "The answer is \\fbox{5}.", "5"),
        ("box_double_braces", "The answer is \\boxed{{5}}.", "5"),
        ("box_nested_text", "The answer is \\boxed{\\text{5 cm}}.", "5"),
        ("box_nested_frac_sqrt", "The answer is \\boxed{\\frac{\\sqrt{3}}{2}}.", r"\frac{\sqrt{3}}{2}"),
        ("box_spaces", "The answer is \\boxed{ 5 }.", "5"),
        ("box_newlines", "The answer is \\boxed{\n5\n}.", "5"),
        ("box_newlines_frac", "<think>\nok\n</think>\n\\boxed{\n\\frac{16}{3}\n}", r"\frac{16}{3}"),
        ("box_spaced_slash", "The answer is \\boxed{16 / 3}.", r"\frac{16}{3}"),
        ("box_left_right", "The answer is \\boxed{\\left(5\\right)}.", "5"),
        ("box_in_display_math", "Thus\n\\[\n\\boxed{12.5}\n\\]", "12.5"),
        ("box_crlf", "<think>\r\nok\r\n</think>\r\n\\boxed{12.5}\r\n", "12.5"),
        ("box_tab", "\tThe answer is\t\\boxed{12.5}\t", "12.5"),
        ("gt_with_spaces", "The answer is \\boxed{12.5}.", " 12.5 "),
        ("gt_degrees", "The answer is \\boxed{60}.", r"60^\circ"),
        ("gt_dfrac", "The answer is \\boxed{16/3}.", r"\dfrac{16}{3}"),
        ("empty_response", "", "5"),
        ("answer_None_literal", "\\boxed{None}", "5"),
        # think-tag (format) variants with a right answer
        ("think_empty", "<think></think>\\boxed{5}", "5"),
        ("think_text_before", "Sure. <think>\nok\n</think>\n\\boxed{5}", "5"),
        ("think_whitespace_before", "\n<think>\nok\n</think>\n\\boxed{5}", "5"),
        ("think_unclosed", "<think>\nok, so it is five.\nThe answer is \\boxed{5}.", "5"),
        ("think_close_only", "ok, so it is five.\n</think>\nThe answer is \\boxed{5}.", "5"),
        ("think_upper", "<THINK>\nok\n</THINK>\n\\boxed{5}", "5"),
        ("think_twice", "<think>a</think><think>b</think>\\boxed{5}", "5"),
        ("think_after_box", "\\boxed{5}<think>ok</think>", "5"),
        ("think_text_after_box", "<think>ok</think>\\boxed{5} is my final answer, in cm.", "5"),
        ("think_answer_tags", "<think>\nok\n</think>\n<answer>\\boxed{5}</answer>", "5"),
        ("think_wrong_answer", "<think>\nok\n</think>\n\\boxed{7}", "5"),
        # unicode
        ("unicode_pi", "<think>ok</think>\\boxed{9π/2}", r"\frac{9\pi}{2}"),
        ("unicode_minus_gt", "\\boxed{-5}", "−5"),
        ("unicode_fullwidth_gt", "\\boxed{5}", "５"),
        ("unicode_sqrt_gt", "\\boxed{2\\sqrt{3}}", "2√3"),
    ]
    rows.extend(specials)

    # long responses (geo3k does not clip, but keep the shape for parity with the other sources)
    for i, (gt, ans) in enumerate(
        [("60", "60"), (r"\frac{16}{3}", "16/3"), ("5", "6"), (r"2\sqrt{3}", r"\sqrt{12}")]
    ):
        long = LONG_FILLER[i % len(LONG_FILLER)]
        rows.append((f"long_box_first:{ans}", f"\\boxed{{{ans}}}\n{long}", gt))
        rows.append((f"long_think_box_first:{ans}", f"<think>\\boxed{{{ans}}}\n{long}</think>\nDone.", gt))
    return rows


# --------------------------------------------------------------------------------------------
# gsm8k
# --------------------------------------------------------------------------------------------

GSM8K_GTS = ["72", "1000", "18", "5", "0", "624", "10", "3", "1250", "36", "2400", "15000"]


def _with_commas(n: str) -> str:
    return f"{int(n):,}"


def _unique_finals(finals: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Drop a variant whose text equals an earlier one (e.g. "1,000"-style commas on "72")."""
    seen: set[str] = set()
    out = []
    for tag, final in finals:
        if final not in seen:
            seen.add(final)
            out.append((tag, final))
    return out


def gsm8k_finals(gt: str) -> list[tuple[str, str]]:
    """(tag, final line) candidates for an integer ground truth."""
    n = int(gt)
    wrong = str(n + 1)
    out = [
        ("plain", f"#### {gt}"),
        ("dot0", f"#### {gt}.0"),
        ("dot00", f"#### {gt}.00"),
        ("trailing_period", f"#### {gt}."),
        ("no_space", f"####{gt}"),
        ("two_spaces", f"####  {gt}"),
        ("tab", f"####\t{gt}"),
        ("five_hashes", f"##### {gt}"),
        ("three_hashes", f"### {gt}"),
        ("dollar", f"#### ${gt}"),
        ("commas", f"#### {_with_commas(gt)}"),
        ("dollar_commas", f"#### ${_with_commas(gt)}"),
        ("units", f"#### {gt} dollars"),
        ("bold", f"#### **{gt}**"),
        ("negative", f"#### -{gt}"),
        ("wrong", f"#### {wrong}"),
        ("leading_zero", f"#### 0{gt}"),
        ("two_lines_right_last", f"#### {wrong}\n#### {gt}"),
        ("two_lines_wrong_last", f"#### {gt}\n#### {wrong}"),
        ("no_hashes", f"The answer is {gt}."),
        ("boxed_only", f"The answer is $\\boxed{{{gt}}}$."),
        ("answer_colon", f"Answer: {gt}"),
        ("fullwidth", "#### " + gt.translate(str.maketrans("0123456789", "０１２３４５６７８９"))),
        ("trailing_text", f"#### {gt} is the final answer"),
        ("space_in_number", f"#### {gt[0]} {gt[1:]}" if len(gt) > 1 else f"#### {gt} "),
    ]
    return out


def build_gsm8k() -> list[Row]:
    rows: list[Row] = []
    rot = Rotor(LINE_SHAPES)
    k = 0
    for gt in GSM8K_GTS:
        for tag, final in _unique_finals(gsm8k_finals(gt)):
            # the core formats get two shapes, the rest one
            n_shapes = 2 if tag in {"plain", "dot0", "commas", "no_space", "wrong"} else 1
            for _ in range(n_shapes):
                shape = rot.next()
                rows.append((f"{shape}:{tag}", line_shape(shape, final, k, GSM_COT), gt))
                k += 1

    cot = GSM_COT[0]
    specials: list[tuple[str, str, str]] = [
        ("dot50_vs_int", f"{cot}\n#### 3.50", "4"),
        ("dot50_vs_dot5", f"{cot}\n#### 3.50", "3.5"),
        ("dot5_vs_dot5", f"{cot}\n#### 3.5", "3.5"),
        ("dot50_vs_dot50", f"{cot}\n#### 3.50", "3.50"),
        ("negative_right", f"{cot}\n#### -5", "-5"),
        ("negative_unicode_minus", f"{cot}\n#### −5", "-5"),
        ("negative_double", f"{cot}\n#### --5", "-5"),
        ("plus_sign", f"{cot}\n#### +72", "72"),
        ("comma_misplaced", f"{cot}\n#### 7,2", "72"),
        ("comma_trailing", f"{cot}\n#### 72,", "72"),
        ("comma_decimal_eu", f"{cot}\n#### 1.000", "1000"),
        ("inline_not_line_start", f"{cot} So the total is #### 72 clips.", "72"),
        ("hash_no_number", f"{cot}\n#### seventy-two", "72"),
        ("hash_empty", f"{cot}\n####", "72"),
        ("hash_then_newline_number", f"{cot}\n####\n72", "72"),
        ("three_lines_middle_right", "#### 70\n#### 72\n#### 74", "72"),
        ("gt_with_spaces", f"{cot}\n#### 72", " 72"),
        ("gt_with_commas", f"{cot}\n#### 1,000", "1,000"),
        ("gt_with_commas_plain_answer", f"{cot}\n#### 1000", "1,000"),
        ("think_hash_inside_only", f"<think>\n{cot}\n#### 72\n</think>\nSo the answer is 72.", "72"),
        ("think_hash_inside_wrong_after_right", f"<think>\n#### 70\n</think>\n{cot}\n#### 72", "72"),
        ("empty_response", "", "72"),
        ("crlf", f"{cot}\r\n#### 72\r\n", "72"),
        ("boxed_and_hash", f"{cot}\n\\boxed{{72}}\n#### 72", "72"),
        ("just_number", "72", "72"),
        ("scientific", "#### 1e3", "1000"),
        ("big_number_commas", "#### 1,234,567", "1234567"),
        ("decimal_leading_dot", "#### .5", "0.5"),
        ("only_dots", "#### ...", "72"),
    ]
    rows.extend(specials)

    # the 300-character window: an answer early in a long response is clipped away
    for i, gt in enumerate(["72", "1000", "18"]):
        long = LONG_FILLER[i % len(LONG_FILLER)]
        rows.append((f"long_hash_first:{gt}", f"#### {gt}\n{long}", gt))
        rows.append((f"long_hash_first_wrong_last:{gt}", f"#### {gt}\n{long}\n#### {int(gt) + 1}", gt))
        rows.append((f"long_wrong_first_right_last:{gt}", f"#### {int(gt) + 1}\n{long}\n#### {gt}", gt))
        rows.append((f"long_think_hash_after:{gt}", f"<think>\n{long}\n</think>\n#### {gt}", gt))
    # exact boundary: "#### 1000" followed by a tail such that the window starts around the marker
    final = "#### 1000"
    for shift in (-2, -1, 0, 1, 2, 5, 6):
        # window start lands `shift` characters into the marker (negative: before it)
        tail_len = 300 - len(final) + shift
        tail = "\n" + ("x" * 7 + " ") * ((tail_len - 1) // 8) + "y" * ((tail_len - 1) % 8)
        rows.append((f"boundary_shift{shift}", LONG_FILLER[0] + "\n" + final + tail, "1000"))
    return rows


# --------------------------------------------------------------------------------------------
# MATH (verl's math_reward.py)
# --------------------------------------------------------------------------------------------

MATH_ANSWERS: dict[str, list[str]] = {
    r"\frac{1}{2}": [
        r"\frac{1}{2}",
        r"\dfrac{1}{2}",
        r"\tfrac{1}{2}",
        r"\frac12",
        "1/2",
        "0.5",
        ".5",
        "0.50",
        r"\frac{2}{4}",
        r"\left(\frac{1}{2}\right)",
        r"x = \frac{1}{2}",
        r"\frac{1}{3}",
        "2",
    ],
    "(1,2)": [
        "(1,2)",
        "(1, 2)",
        r"\left(1, 2\right)",
        r"\left( 1,2 \right)",
        "(2,1)",
        "[1,2]",
        "1,2",
        r"(1,\!2)",
    ],
    r"\sqrt{2}": [
        r"\sqrt{2}",
        r"\sqrt2",
        r"\sqrt {2}",
        "√2",
        "1.414",
        r"\frac{2}{\sqrt{2}}",
        r"2\sqrt{2}",
        r"\sqrt{3}",
    ],
    r"10\%": [r"10\%", "10%", "10", r"10 \%", "0.1", r"\frac{1}{10}", r"10\\%", "11"],
    "x^2+1": ["x^2+1", "x^2 + 1", "1+x^2", r"x^{2}+1", "x**2+1", r"y = x^2+1", "x^2-1"],
    r"\text{(B)}": [r"\text{(B)}", "(B)", "B", r"\textbf{(B)}", r"\mathrm{(B)}", r"\text{B}", r"\text{(C)}"],
    r"90^\circ": [
        r"90^\circ",
        r"90^{\circ}",
        "90",
        "90°",
        r"90 \text{ degrees}",
        "90 degrees",
        r"\frac{\pi}{2}",
        "45",
    ],
    r"\frac{\sqrt{3}}{2}": [
        r"\frac{\sqrt{3}}{2}",
        r"\frac{\sqrt3}{2}",
        r"\sqrt{3}/2",
        r"\dfrac{\sqrt{3}}{2}",
        r"\frac{1}{2}\sqrt{3}",
        r"\frac{\sqrt{3}}{3}",
    ],
    r"2\sqrt{3}": [r"2\sqrt{3}", r"2\sqrt3", r"2 \sqrt{3}", r"\sqrt{12}", "2√3", r"3\sqrt{2}"],
    r"\frac{16}{3}": [
        r"\frac{16}{3}",
        "16/3",
        r"\dfrac{16}{3}",
        r"5\frac{1}{3}",
        "5.333333",
        r"\frac{16}3",
        r"\frac{32}{6}",
    ],
    r"\frac{9\pi}{2}": [
        r"\frac{9\pi}{2}",
        r"4.5\pi",
        r"\frac{9}{2}\pi",
        r"\dfrac{9\pi}{2}",
        r"\frac{9 \pi}{2}",
        r"9\pi/2",
    ],
    "5": [
        "5",
        "5.0",
        r"\text{5}",
        "{5}",
        "x=5",
        "x = 5",
        "k=5",
        "abc=5",
        r"5 \text{ cm}",
        r"5\text{ cm}",
        "５",
        "6",
    ],
    "-3": ["-3", "−3", "- 3", "-3.0", "(-3)", "3", r"x=-3"],
    "1000": ["1000", "1,000", "1{,}000", r"1,\!000", r"1\,000", "10^3", "1000.0"],
    r"\$18.90": [r"\$18.90", "18.90", "18.9", r"\$ 18.90", r"\$18.9", "$18.90"],
    "[-2,3)": ["[-2,3)", "[-2, 3)", r"\left[-2,3\right)", "(-2,3)", "[-2,3]"],
    r"\text{Monday}": [r"\text{Monday}", "Monday", r"\textbf{Monday}", r"\text{monday}", r"\text{ Monday}"],
    r"3\pi": [r"3\pi", r"3 \pi", "3π", r"\pi \cdot 3", r"3\pi \text{ cm}^2"],
    "12": ["12", "12.", "012", r"12 \text{ inches}", "12 inches", "13"],
    r"\infty": [r"\infty", "∞", r"+\infty", "infinity"],
    "0": ["0", "0.0", "-0", r"\text{0}", "O"],
}


def build_math() -> list[Row]:
    rows: list[Row] = []
    rot = Rotor(BOXED_PLAIN + BOXED_THINK)
    k = 0
    for gt, answers in MATH_ANSWERS.items():
        for ans in answers:
            frag = "\\boxed{" + ans + "}"
            for _ in range(2):
                shape = rot.next()
                rows.append((f"{shape}:{ans}", boxed_shape(shape, frag, k, MATH_REASON), gt))
                k += 1

    r = MATH_REASON[0]
    specials: list[tuple[str, str, str]] = [
        (
            "boxes_first_right_last_wrong",
            f"{r}\n\\boxed{{\\frac{{1}}{{2}}}} or maybe \\boxed{{\\frac{{1}}{{3}}}}",
            r"\frac{1}{2}",
        ),
        (
            "boxes_first_wrong_last_right",
            f"{r}\n\\boxed{{\\frac{{1}}{{3}}}} or rather \\boxed{{\\frac{{1}}{{2}}}}",
            r"\frac{1}{2}",
        ),
        ("boxes_think_wrong_then_right", "<think>\n\\boxed{3}\n</think>\nThe answer is \\boxed{5}.", "5"),
        ("boxes_think_right_then_wrong", "<think>\n\\boxed{5}\n</think>\nThe answer is \\boxed{3}.", "5"),
        ("no_box", f"{r}\nThe answer is 5.", "5"),
        ("no_box_dollars", "The answer is $5$.", "5"),
        ("no_box_bare", "5", "5"),
        ("box_no_braces", "The answer is \\boxed 5.", "5"),
        ("box_no_braces_dollars", "The answer is $\\boxed 5$.", "5"),
        ("box_no_braces_end", "The answer is \\boxed 5", "5"),
        ("box_no_braces_newline", "The answer is \\boxed 5\nDone", "5"),
        ("box_no_braces_frac", "So we get $\\boxed \\frac{1}{2}$.", r"\frac{1}{2}"),
        ("box_space_before_brace", "The answer is \\boxed {5}.", "5"),
        ("box_space_before_brace_dollars", "The answer is $\\boxed {5}$.", "5"),
        ("box_no_braces_then_braces", "First \\boxed 3 then \\boxed{5}.", "5"),
        ("box_braces_then_no_braces", "First \\boxed{5} then $\\boxed 3$.", "5"),
        ("box_unclosed", "The answer is \\boxed{5", "5"),
        ("box_unclosed_after_good", "\\boxed{5} and later \\boxed{6", "5"),
        ("box_empty", "The answer is \\boxed{}.", "5"),
        ("box_empty_gt_empty", "The answer is \\boxed{}.", ""),
        ("fbox", "The answer is \\fbox{5}.", "5"),
        ("fbox_and_boxed", "\\boxed{5} and \\fbox{6}", "5"),
        ("boxed_word_no_brace", "The \\boxed answer is 5.", "5"),
        ("box_double_braces", "The answer is \\boxed{{5}}.", "5"),
        ("box_nested_text_units", "The answer is \\boxed{5\\text{ cm}}.", "5"),
        ("box_nested_text_units_twice", "The answer is \\boxed{5\\text{ cm} \\text{ long}}.", "5"),
        ("box_spaces", "The answer is \\boxed{ 5 }.", "5"),
        ("box_newlines", "The answer is \\boxed{\n5\n}.", "5"),
        ("box_inverse_space", "The answer is \\boxed{1\\!000}.", "1000"),
        ("box_double_backslash", "The answer is \\boxed{\\\\frac{1}{2}}.", r"\frac{1}{2}"),
        ("box_in_display_math", "Thus\n\\[\n\\boxed{\\frac{1}{2}}\n\\]", r"\frac{1}{2}"),
        ("box_crlf", "<think>\r\nok\r\n</think>\r\n\\boxed{12}\r\n", "12"),
        ("empty_response", "", "5"),
        ("gt_unnormalized", "\\boxed{\\frac{1}{2}}", r"\dfrac12"),
        ("gt_with_spaces", "\\boxed{5}", " 5 "),
        ("gt_percent_plain", "\\boxed{10\\%}", "10"),
        ("unicode_minus_gt", "\\boxed{-3}", "−3"),
        ("unicode_pi", "\\boxed{3π}", r"3\pi"),
        ("unicode_sqrt_gt", "\\boxed{\\sqrt{2}}", "√2"),
        ("slash_non_int", "\\boxed{\\sqrt{3}/2}", r"\frac{\sqrt{3}}{2}"),
        ("slash_negative", "\\boxed{-1/2}", r"-\frac{1}{2}"),
        ("slash_three", "\\boxed{1/2/3}", r"\frac{1}{2}"),
        ("frac_short_chain", "\\boxed{\\frac1{72}}", r"\frac{1}{72}"),
        ("frac_short_rev", "\\boxed{\\frac{72}1}", "72"),
        ("frac_one_char", "\\boxed{\\frac1}", r"\frac{1}{1}"),
        ("sqrt_trailing", "\\boxed{\\sqrt}", r"\sqrt{2}"),
        ("equals_long_lhs", "\\boxed{abc = 5}", "5"),
        ("equals_two", "\\boxed{x = y = 5}", "5"),
        ("text_space_units_twice", "\\boxed{5\\text{ m}\\text{ s}}", "5"),
        ("dollar_inside", "\\boxed{\\$5}", "5"),
        ("dollar_plain_inside", "\\boxed{$5$}", "5"),
        ("think_no_box", "<think>\nok\n</think>\nThe answer is 5.", "5"),
    ]
    rows.extend(specials)

    for i, (gt, ans) in enumerate([("5", "5"), (r"\frac{1}{2}", "0.5"), ("12", "13")]):
        long = LONG_FILLER[i % len(LONG_FILLER)]
        rows.append((f"long_box_first:{ans}", f"\\boxed{{{ans}}}\n{long}", gt))
        rows.append((f"long_box_first_wrong_last:{ans}", f"\\boxed{{{ans}}}\n{long}\n\\boxed{{99}}", gt))
    return rows


# --------------------------------------------------------------------------------------------
# DAPO-math (verl's math_dapo.py)
# --------------------------------------------------------------------------------------------

DAPO_GTS = ["34", "1000", "-5", "0", "12", "204", "7", "2024"]


def dapo_finals(gt: str) -> list[tuple[str, str]]:
    n = int(gt)
    wrong = str(n + 1)
    commas = _with_commas(gt)
    minus_u = gt.replace("-", "−")
    return [
        ("answer", f"Answer: {gt}"),
        ("answer_lower", f"answer: {gt}"),
        ("answer_upper_nospace", f"ANSWER:{gt}"),
        ("answer_space_colon", f"Answer : {gt}"),
        ("answer_newline", f"Answer:\n{gt}"),
        ("answer_dollars", f"Answer: ${gt}$"),
        ("answer_boxed", f"Answer: \\boxed{{{gt}}}"),
        ("answer_dollars_boxed", f"Answer: $\\boxed{{{gt}}}$"),
        ("answer_period", f"Answer: {gt}."),
        ("answer_units", f"Answer: {gt} degrees"),
        ("answer_commas", f"Answer: {commas}"),
        ("answer_equation", f"Answer: x = {gt}"),
        ("answer_dot0", f"Answer: {gt}.0"),
        ("answer_unicode_minus", f"Answer: {minus_u}"),
        ("answer_fullwidth", "Answer: " + gt.translate(str.maketrans("0123456789", "０１２３４５６７８９"))),
        ("answer_text", f"Answer: \\text{{{gt}}}"),
        ("answer_bold_md", f"**Answer:** {gt}"),
        ("final_answer", f"Final Answer: {gt}"),
        ("answer_is_colon", f"The answer is: {gt}"),
        ("answer_wrong", f"Answer: {wrong}"),
        ("answer_right_then_wrong", f"Answer: {gt}\nAnswer: {wrong}"),
        ("answer_wrong_then_right", f"Answer: {wrong}\nAnswer: {gt}"),
        ("answer_wrong_box_right", f"The answer is \\boxed{{{gt}}}.\nAnswer: {wrong}"),
        ("answer_right_box_wrong", f"The answer is \\boxed{{{wrong}}}.\nAnswer: {gt}"),
        ("box_only", f"The answer is $\\boxed{{{gt}}}$."),
        ("box_only_spaces", f"The answer is \\boxed{{ {gt} }}."),
        ("box_only_dot0", f"The answer is \\boxed{{{gt}.0}}."),
        ("box_only_commas", f"The answer is \\boxed{{{commas}}}."),
        ("box_only_wrong", f"The answer is \\boxed{{{wrong}}}."),
        ("boxes_right_then_wrong", f"First \\boxed{{{gt}}}, then \\boxed{{{wrong}}}."),
        ("boxes_wrong_then_right", f"First \\boxed{{{wrong}}}, then \\boxed{{{gt}}}."),
        ("no_answer", f"The result is {gt}."),
        ("hash_line", f"#### {gt}"),
    ]


def build_math_dapo() -> list[Row]:
    rows: list[Row] = []
    rot = Rotor(LINE_SHAPES)
    k = 0
    for gt in DAPO_GTS:
        for tag, final in _unique_finals(dapo_finals(gt)):
            n_shapes = 2 if tag in {"answer", "box_only", "answer_wrong", "answer_boxed"} else 1
            for _ in range(n_shapes):
                shape = rot.next()
                rows.append((f"{shape}:{tag}", line_shape(shape, final, k, MATH_REASON), gt))
                k += 1

    r = MATH_REASON[1]
    specials: list[tuple[str, str, str]] = [
        ("answer_empty_at_end", f"{r}\nAnswer:", "34"),
        ("answer_empty_then_box", f"{r}\nAnswer:\n\\boxed{{34}}", "34"),
        ("answer_blank_then_box", f"{r}\nAnswer: \n\\boxed{{34}}", "34"),
        ("answer_text_a_prefix", "Answer: a 34", "34"),
        ("answer_text_an_prefix", "Answer: an 34", "34"),
        ("answer_units_students", "Answer: 34 students", "34"),
        ("answer_degree_circ", "Answer: 34^\\circ", "34"),
        ("answer_dollar_sign", "Answer: \\$34", "34"),
        ("answer_ldots", "Answer: 34\\ldots", "34"),
        ("answer_comma_brace", "Answer: 1{,}000", "1000"),
        ("answer_thin_space", "Answer: 1\\,000", "1000"),
        ("answer_inline_math_text", "Answer: The value is $34$ exactly", "34"),
        ("answer_in_sentence", "So my answer: 34", "34"),
        ("answer_think_only", "<think>\nAnswer: 34\n</think>\nThat is the result.", "34"),
        ("answer_think_wrong_then_right", "<think>\nAnswer: 33\n</think>\nAnswer: 34", "34"),
        ("answer_crlf", f"{r}\r\nAnswer: 34\r\n", "34"),
        ("answer_frac", "Answer: \\frac{1}{2}", "\\frac{1}{2}"),
        ("answer_frac_short", "Answer: \\frac12", "\\frac{1}{2}"),
        ("answer_sqrt_short", "Answer: \\sqrt2", "\\sqrt{2}"),
        ("answer_overline", "Answer: 0.\\overline{3}", "0.3"),
        ("answer_gt_unnormalized", "Answer: 34", "34 degrees"),
        ("box_gt_unnormalized", "\\boxed{34}", " 34"),
        ("box_nested", "The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("box_no_braces", "The answer is \\boxed 34.", "34"),
        ("box_unclosed", "The answer is \\boxed{34", "34"),
        ("box_text_inside", "The answer is \\boxed{\\text{34}}.", "34"),
        ("empty_response", "", "34"),
        ("gt_invalid_marker", "The result is 34.", "[INVALID]"),
        ("box_invalid_marker", "\\boxed{[INVALID]}", "34"),
    ]
    rows.extend(specials)

    # the 300-character window (Answer:) and the 100-character window (box fallback)
    for i, gt in enumerate(["34", "1000", "-5"]):
        long = LONG_FILLER[i % len(LONG_FILLER)]
        wrong = str(int(gt) + 1)
        rows.append((f"long_answer_first:{gt}", f"Answer: {gt}\n{long}", gt))
        rows.append((f"long_answer_first_wrong_last:{gt}", f"Answer: {gt}\n{long}\nAnswer: {wrong}", gt))
        rows.append((f"long_box_first:{gt}", f"\\boxed{{{gt}}}\n{long}", gt))
        rows.append((f"long_answer_first_box_last:{gt}", f"Answer: {gt}\n{long}\n\\boxed{{{gt}}}", gt))
        rows.append((f"long_box_before_150_tail:{gt}", f"{long}\n\\boxed{{{gt}}}\n{long[:150]}", gt))
        rows.append((f"long_think_answer_after:{gt}", f"<think>\n{long}\n</think>\nAnswer: {gt}", gt))
    for shift in (-2, -1, 0, 1, 3, 8):
        final = "Answer: 1000"
        tail_len = 300 - len(final) + shift
        tail = "\n" + ("z" * 7 + " ") * ((tail_len - 1) // 8) + "w" * ((tail_len - 1) % 8)
        rows.append((f"boundary300_shift{shift}", LONG_FILLER[1] + "\n" + final + tail, "1000"))
    for shift in (-2, -1, 0, 1, 2, 7):
        final = "\\boxed{1000}"
        tail_len = 100 - len(final) + shift
        tail = "\n" + ("q" * 7 + " ") * ((tail_len - 1) // 8) + "v" * ((tail_len - 1) % 8)
        rows.append((f"boundary100_shift{shift}", LONG_FILLER[2] + "\n" + final + tail, "1000"))
    return rows


BUILDERS: dict[str, Callable[[], list[Row]]] = {
    "geo3k": build_geo3k,
    "gsm8k": build_gsm8k,
    "math": build_math,
    "math_dapo": build_math_dapo,
}


# --------------------------------------------------------------------------------------------
# scoring with verl
# --------------------------------------------------------------------------------------------


def load_verl_module(verl_src: Path, filename: str) -> ModuleType:
    path = verl_src / "verl" / "utils" / "reward_score" / filename
    if not path.is_file():
        raise SystemExit(f"not found: {path} (pass --verl-src, the dir that holds verl/utils/reward_score/)")
    name = f"_verl_reward_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class _RowTimeout(Exception):
    pass


def _on_alarm(signum, frame):  # pragma: no cover - only on a hang
    raise _RowTimeout()


def dedupe(rows: list[Row]) -> Iterator[Row]:
    seen: set[tuple[str, str]] = set()
    for case, sol, gt in rows:
        if (sol, gt) in seen:
            continue
        seen.add((sol, gt))
        yield case, sol, gt


def score_rows(source: str, mod: ModuleType, rows: list[Row]) -> tuple[list[dict], int]:
    out: list[dict] = []
    printed = 0  # rows where verl caught an exception itself and printed it (math_reward)
    signal.signal(signal.SIGALRM, _on_alarm)
    for case, sol, gt in dedupe(rows):
        rec: dict = {"case": case, "solution_str": sol, "ground_truth": gt}
        buf = io.StringIO()
        signal.alarm(ROW_TIMEOUT_S)
        try:
            with contextlib.redirect_stdout(buf):
                res = mod.compute_score(sol, gt)
        except _RowTimeout:
            rec.update(score=None, error="Timeout")
        except Exception as e:  # record the row, do not stop
            rec.update(score=None, error=type(e).__name__)
        else:
            if source == "math_dapo":
                rec.update(score=float(res["score"]), acc=bool(res["acc"]), pred=res["pred"])
            else:
                rec["score"] = float(res)
        finally:
            signal.alarm(0)
        if buf.getvalue():
            printed += 1
        out.append(rec)
    return out, printed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verl-src", type=Path, required=True, help="dir containing verl/utils/reward_score/")
    ap.add_argument("--out", type=Path, default=HERE, help="output dir (default: this script's dir)")
    ap.add_argument(
        "--only", default=",".join(BUILDERS), help="comma-separated subset of " + ",".join(BUILDERS)
    )
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    for source in [s.strip() for s in args.only.split(",") if s.strip()]:
        mod = load_verl_module(args.verl_src, MODULE_FILES[source])
        recs, printed = score_rows(source, mod, BUILDERS[source]())
        path = args.out / f"{source}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for rec in recs:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        dist = Counter("null" if r["score"] is None else repr(r["score"]) for r in recs)
        errors = Counter(r["error"] for r in recs if "error" in r)
        print(
            f"{source}: {len(recs)} rows -> {path} ({path.stat().st_size} bytes); scores {dict(sorted(dist.items()))}"
            + (f"; errors {dict(errors)}" if errors else "")
            + (f"; verl printed a caught exception on {printed} rows" if printed else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
