"""Dataset rows: how one source row becomes a verl-format row, per known dataset. Pure functions, no I/O.

A verl-format row has `data_source` (the reward registry key), `prompt` (chat messages), `ability`,
`reward_model` ({"style": "rule", "ground_truth": ...}) and `extra_info` (split, index, the original
question and answer); image datasets also carry `images`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RowFn = Callable[[Mapping[str, Any], int, str], dict[str, Any]]

GEO3K_INSTRUCTION = (
    "Reason about the problem inside <think> </think> tags first, "
    "then write only the final answer inside \\boxed{}."
)
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# gsm8k with the calculator (`--dataset gsm8k_tool`): verl's gsm8k_multiturn_w_tool rows, the
# system turn naming grpo's built-in calculator instead of verl's calc_gsm8k_reward tool.
GSM8K_TOOL_SYSTEM = (
    "You are a math expert. Solve the question step by step. For any arithmetic, call the `calculator` "
    "tool with the expression and use its answer; you may call it several times. Put your final answer "
    "in the format of `#### <answer>`."
)

_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class DatasetRecipe:
    name: str
    hub_id: str  # also the rows' data_source: the key the reward functions are registered under
    hub_config: str | None
    required_columns: tuple[str, ...]
    # output split -> source split names to try, in order
    splits: Mapping[str, tuple[str, ...]]
    to_row: RowFn


def _extra(split: str, index: int, question: str, answer: str) -> dict[str, Any]:
    return {"split": split, "index": index, "question": question, "answer": answer}


def geo3k_row(example: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
    problem = str(example["problem"]).strip()
    answer = str(example["answer"]).strip()
    return {
        "data_source": GEO3K.hub_id,
        "prompt": [{"role": "user", "content": f"{problem} {GEO3K_INSTRUCTION}"}],
        "images": example.get("images") or [],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": _extra(split, index, problem, answer),
    }


def gsm8k_final_answer(solution: str) -> str:
    """The number after "####" in a GSM8K solution, thousands separators removed."""
    match = _GSM8K_ANSWER.search(solution)
    if match is None:
        raise ValueError(f"GSM8K solution has no '#### <answer>' line: {solution[-80:]!r}")
    return match.group(1).replace(",", "").strip()


def gsm8k_row(example: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
    question = str(example["question"]).strip()
    solution = str(example["answer"])
    return {
        "data_source": GSM8K.hub_id,
        "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gsm8k_final_answer(solution)},
        "extra_info": _extra(split, index, question, solution),
    }


def gsm8k_tool_row(example: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
    """A gsm8k row whose system turn asks for the calculator (rollout.multi_turn.tools=[calculator]);
    scored as gsm8k (the same data_source)."""
    row = gsm8k_row(example, index, split)
    row["prompt"] = [{"role": "system", "content": GSM8K_TOOL_SYSTEM}, *row["prompt"]]
    return row


GEO3K = DatasetRecipe(
    name="geo3k",
    hub_id="hiyouga/geometry3k",
    hub_config=None,
    required_columns=("problem", "answer"),
    splits={"train": ("train",), "test": ("test", "validation")},
    to_row=geo3k_row,
)
GSM8K = DatasetRecipe(
    name="gsm8k",
    hub_id="openai/gsm8k",
    hub_config="main",
    required_columns=("question", "answer"),
    splits={"train": ("train",), "test": ("test", "validation")},
    to_row=gsm8k_row,
)
GSM8K_TOOL = dataclasses.replace(GSM8K, name="gsm8k_tool", to_row=gsm8k_tool_row)
RECIPES: Mapping[str, DatasetRecipe] = {r.name: r for r in (GEO3K, GSM8K, GSM8K_TOOL)}
