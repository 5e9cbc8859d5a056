"""Shared fixtures for the vLLM engine tests: one tiny Qwen3 and ONE engine for the whole session
(engine start-up costs ~45 s on 2 CPU cores). Tests that change the engine's weights put the
original ones back before they return."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # this folder's helpers: `from sync_check import ...`


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory):
    """(model_dir, HF model, tokenizer) of a random float32 Qwen3: hidden 128, head_dim 32, 2 layers."""
    from grpo_tiny.hf_models import build_tiny_qwen3

    model_dir = tmp_path_factory.mktemp("tiny_qwen3")
    model, tokenizer = build_tiny_qwen3(model_dir, seed=0)
    return Path(model_dir), model, tokenizer


@pytest.fixture(scope="session")
def vllm_cfg():
    from grpo_config.schema import ActorConfig, DataConfig, RolloutConfig, TrainerConfig

    return TrainerConfig(
        seed=7,
        actor=ActorConfig(dtype="float32"),
        data=DataConfig(max_prompt_length=64, max_response_length=32, train_batch_size=4),
        rollout=RolloutConfig(
            engine="vllm",
            n=4,
            enforce_eager=True,
            gpu_memory_utilization=0.3,
            weight_sync_bucket_mb=1,
            dtype="float32",
            max_num_batched_tokens=200,
            engine_kwargs={"max_num_seqs": 48},
        ),
    )


@pytest.fixture(scope="session")
def vllm_engine(tiny_qwen3, vllm_cfg):
    pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")
    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    model_dir, _, _ = tiny_qwen3
    engine = VLLMRolloutEngine.from_config(vllm_cfg, str(model_dir))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def prompts(tiny_qwen3) -> list[list[int]]:
    _, _, tokenizer = tiny_qwen3
    texts = ["the quick brown fox", "over the lazy dog 3", "jumps"]
    return [tokenizer(t)["input_ids"] for t in texts]
