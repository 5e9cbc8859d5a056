"""The tiny builders on their own: the task's score and rows, the text and vision-language models."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from grpo_tiny import model, task, vl_model, vl_task


def test_the_task_scores_the_share_of_the_asked_digit() -> None:
    assert task.score("7", "7") == task.score(" 7 7 7 ", "7") == 1.0
    assert task.score("7a", "7") == 0.5 and task.score("", "7") == 0.0
    with pytest.raises(ValueError, match="one character"):
        task.score("7", "77")
    rows = task.make_rows(count=4, seed=3, split="train")
    assert rows == task.make_rows(count=4, seed=3, split="train")  # seeded
    assert {row["data_source"] for row in rows} == {task.DATA_SOURCE}


def test_the_text_model_is_a_shrunk_qwen35_moe_built_once(tmp_path: Path) -> None:
    path = model.ensure_tiny_model(tmp_path / "m", texts=task.corpus())
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "qwen3_5_moe_text" and config.num_experts > config.num_experts_per_tok > 1
    assert {"linear_attention", "full_attention"} <= set(config.layer_types)
    stamp = (path / "config.json").stat().st_mtime_ns
    assert model.ensure_tiny_model(tmp_path / "m", texts=task.corpus()) == path
    assert (path / "config.json").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_the_vision_language_model_and_task(tmp_path: Path) -> None:
    path = vl_model.ensure_tiny_vl_model(tmp_path / "vl", texts=vl_task.corpus())
    assert AutoConfig.from_pretrained(path).architectures == ["Qwen3_5MoeForConditionalGeneration"]
    (row,) = vl_task.make_rows(count=1, seed=2, split="train")
    assert row["data_source"] == vl_task.DATA_SOURCE and len(row["images"]) == 1
