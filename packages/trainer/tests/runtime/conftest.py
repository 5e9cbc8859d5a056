"""Fixtures for the runtime tests: the tiny preset's real model and tokenizer, built once."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_tiny import model as tiny_model
    from grpo_tiny import task as tiny_task

    return tiny_model.ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=tiny_task.corpus())


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loaded.set_experts_implementation("eager")
    return loaded.eval()


@pytest.fixture
def prompts(tokenizer) -> list[list[int]]:
    texts = ["repeat 7", "say 3", "echo 0"]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
