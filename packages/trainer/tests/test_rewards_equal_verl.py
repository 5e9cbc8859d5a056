"""The built-in rewards give verl's scores exactly: rows of (response, ground truth, verl's score)
per data source, produced by verl's own reward functions (packages/trainer/tests/data/verl_rewards/README.md says
which verl, how, and how to regenerate); the test does not import verl. Each row's data source
goes through the registry as the reward manager resolves it, with the default grader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_trainer.rewards import get_reward_fn

CORPUS = Path(__file__).parent / "data" / "verl_rewards"
# corpus file -> a data source verl scores with that function
SOURCES = {
    "geo3k": "hiyouga/geometry3k",
    "gsm8k": "openai/gsm8k",
    "math": "lighteval/MATH",
    "math_dapo": "math_dapo",
}


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (CORPUS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_row_scores_as_verl_scores_it(name: str) -> None:
    fn = get_reward_fn(SOURCES[name])
    rows = _rows(name)
    assert len(rows) >= 300
    differences = []
    for row in rows:
        got = fn(row["solution_str"], row["ground_truth"], None)
        if isinstance(got, dict):
            if "acc" in row and got["acc"] != row["acc"]:
                differences.append((row, got))
            got = got["score"]
        if float(got) != row["score"]:
            differences.append((row, got))
    assert differences == [], f"{len(differences)} of {len(rows)} differ; first: {differences[:3]}"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_corpus_tells_right_from_wrong(name: str) -> None:
    """A corpus where every score were equal could not catch a grader that returns a constant."""
    assert len({row["score"] for row in _rows(name)}) >= 2
