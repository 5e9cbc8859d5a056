"""The tiny-tool task: its score credits each step towards the answer in order, its tool knows every
key of the data, and its tokenizer writes a call and a tool answer in a few tokens."""

from __future__ import annotations

import pytest

from grpo_tiny import lookup_tool, tool_task
from grpo_tiny.model import build_tokenizer

OPEN, CLOSE = tool_task.CALL
ANSWER = "\nuser\n<tool_response>\n{}\n</tool_response>\nassistant\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7 7", 0.5),  # no call: the guess alone
        ("3", 0.0),
        (f"{OPEN}c", 0.1),  # begun
        (f"{OPEN}c{CLOSE}", 0.2),  # closed, but the turn never ended: no answer
        (f"{OPEN}x{CLOSE}{ANSWER.format('no such key')}3", 0.3),  # answered, not the secret
        (f"{OPEN}a{CLOSE}{ANSWER.format('7')}", 0.5),  # the secret, no final answer
        (f"{OPEN}a{CLOSE}{ANSWER.format('7')}7", 1.0),
        (f"{OPEN}a{CLOSE}{ANSWER.format('7')}73", 0.75),
    ],
)
def test_the_score_credits_each_step_in_order(text: str, expected: float) -> None:
    assert tool_task.score(text, "7") == pytest.approx(expected)


def test_the_tool_knows_each_key_and_the_rows_ask_for_them() -> None:
    rows = tool_task.make_rows(count=64, seed=0, split="train")
    assert {r["prompt"][0]["content"] for r in rows} == {f"find {k}" for k in tool_task.KEYS}
    for row in rows:
        key = row["prompt"][0]["content"].split()[-1]
        assert lookup_tool.lookup(f" {key}") == row["reward_model"]["ground_truth"]
    assert lookup_tool.lookup("z") == "no such key"
    assert len(set(lookup_tool.SECRETS.values())) == len(tool_task.KEYS)


def test_a_call_and_a_tool_answer_are_a_few_tokens() -> None:
    tokenizer = build_tokenizer(tool_task.corpus(), vocab_size=56, tools=True, call=tool_task.CALL)
    call = tokenizer.encode(f"{OPEN} c{CLOSE}", add_special_tokens=False)
    assert len(call) == 3
    text = "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert len(tokenizer.encode(text, add_special_tokens=False)) == 14
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text  # nothing dropped
