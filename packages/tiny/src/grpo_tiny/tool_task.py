"""The tiny-tool preset's task (data_source "grpo/tiny_tool"): "find k" asks for key k's secret
digit, which only the `lookup` tool knows (`lookup_tool`), so the tiny model can solve it only by
calling the tool with the key and copying the digit it answers.

The score rewards each step a little (`score`): beginning and closing a call, a tool answer, the
secret among the answers, then the final answer's share of the secret digit (half the score). A
model that never calls scores at most 0.5 by guessing the digit; a random one writes a whole call
too rarely to learn from it without the first steps' credit. docs/MULTI_TURN.md, "The tiny-tool preset".
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_tiny import lookup_tool
from grpo_tiny.model import call_tokens

DATA_SOURCE = "grpo/tiny_tool"
KEYS = tuple(lookup_tool.SECRETS)
SCORE_FN = "grpo_tiny.tool_task:score"
TOOL_FILE = Path(lookup_tool.__file__)
CALL = call_tokens("lookup", "key")
_ANSWER = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def score(solution_str: str, ground_truth: str, extra_info: Mapping[str, Any] | None = None) -> float:
    """Each step towards the answer, in order: a call begun (0.1) and closed (0.1), a tool answer in
    the response (0.1), the secret among the answers (0.2: the prompt's key was asked for), and 0.5
    times the share of the secret digit among the characters after the last answer."""
    del extra_info
    opened = CALL[0] in solution_str
    closed = opened and CALL[1] in solution_str.split(CALL[0], 1)[1]
    answers = _ANSWER.findall(solution_str)
    final = solution_str.rsplit("</tool_response>", 1)[-1].removeprefix("\nassistant\n")
    chars = [c for c in final if not c.isspace()]
    share = sum(c == ground_truth for c in chars) / len(chars) if chars else 0.0
    return 0.1 * opened + 0.1 * closed + 0.1 * bool(answers) + 0.2 * (ground_truth in answers) + 0.5 * share


def make_rows(*, count: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`count` verl-format rows: "find k", the ground truth k's secret digit."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        key = rng.choice(KEYS)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"find {key}"}],
                "ability": "tool",
                "reward_model": {"style": "rule", "ground_truth": lookup_tool.SECRETS[key]},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def corpus() -> list[str]:
    """The tokenizer's text: the prompts, the digits, the tool's answers and the template's words."""
    lines = [f"find {key}" for key in KEYS]
    lines += ["0123456789", "no such key", *["user\n", "assistant\n"] * 8]
    return lines
