"""Multi-turn rollouts through `train()` (issue 45): two ranks on the CPU, colocated `hf` engine,
torch backend; the driver runs the calculator for every replica and each replica samples its own
responses' further turns; the trainer trains on the sampled ids only.

The tiny model is primed to write calculator calls (`grpo_tiny.model.prime_tool_calls`). The same
step on vLLM with the Megatron actor: tests/test_vllm_replicas.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import grpo_config
from grpo_launch import tiny_preset
from grpo_tiny import model as tiny_model
from grpo_tiny import task as tiny_task
from grpo_trainer import read_metrics, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def tool_config(workdir: Path, turns: list[str], *overrides: str) -> grpo_config.TrainerConfig:
    """The tiny preset on a model primed to call the calculator, multi-turn on (`turns`: the
    `short_calculator_turns` fixture), no validation."""
    model_dir = workdir / "tool_model"
    if not model_dir.exists():
        tiny_model.ensure_tiny_model(model_dir, texts=tiny_task.corpus(), tools=True)
        tiny_model.prime_tool_calls(model_dir)
    return grpo_config.load(
        tiny_preset(workdir),
        [f"actor.model_path={model_dir}", "test_freq=-1", "rollout.multi_turn.tool_timeout_s=5", *turns, *overrides],
    )


@pytest.fixture(scope="module")
def tool_run(ray_cluster, tmp_path_factory, short_calculator_turns):
    result = train(tool_config(tmp_path_factory.mktemp("multi_turn"), short_calculator_turns, "total_training_steps=2"))
    return result, read_metrics(result.metrics_path)


def test_a_step_calls_tools_and_trains_on_the_sampled_ids_only(tool_run) -> None:
    """With `rollout.multi_turn.enable` (the `short_calculator_turns` fixture) each step calls the
    calculator, and the metrics count the turns and the tool tokens left out of training."""
    result, records = tool_run
    assert result.final_step == 2
    steps = [r for r in records.values() if "multi_turn/call_rate" in r]
    assert len(steps) == 2
    for metrics in steps:
        assert 0 < metrics["multi_turn/call_rate"] <= 1
        assert metrics["multi_turn/tool_calls_mean"] > 0
        assert metrics["multi_turn/assistant_turns_mean"] > 1
        assert metrics["multi_turn/tool_tokens_mean"] > 0
        # A response's length counts the tool messages; what is trained on does not.
        sampled, whole = metrics["multi_turn/sampled_tokens_mean"], metrics["response_length/mean"]
        assert 0 < sampled < whole
        assert math.isclose(whole - sampled, metrics["multi_turn/tool_tokens_mean"], rel_tol=1e-6)
        assert math.isfinite(metrics["actor/grad_norm"]) and math.isfinite(metrics["reward/mean"])


def test_one_step_off_rollout_workers_run_the_turns_and_a_resumed_run_goes_on(
    ray_cluster, tmp_path, short_calculator_turns
) -> None:
    """rollout.mode=one_step_off: the rollout worker's engine runs the turns itself
    (`MultiTurnEngine`), one update behind; then a checkpoint of multi-turn steps is resumed. Where
    the engine samples with the policy's weights (the first step, and the first resumed one, whose
    weights the checkpoint sends) its log-probs equal the policy's over the sampled tokens, so the
    worker's trajectories carry the tool messages where the trained rows have them."""
    one_step_off = [
        "device.devices_per_node=1",
        "rollout.mode=one_step_off",
        "rollout.devices_per_node=1",
        "algorithm.rollout_correction.rollout_is=token",
        "checkpoint.save_freq=2",
    ]
    first = train(tool_config(tmp_path, short_calculator_turns, *one_step_off, "total_training_steps=2"))
    resumed = train(tool_config(tmp_path, short_calculator_turns, *one_step_off, "total_training_steps=3"))
    assert (first.final_step, resumed.final_step) == (2, 3)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "global_step_2"
    records = read_metrics(resumed.metrics_path)
    assert [records[s]["rollout/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 0.0]
    assert records[1]["rollout/logprob_abs_diff"] < 1e-5 and records[3]["rollout/logprob_abs_diff"] < 1e-5
    went_on = [s for s in (1, 2, 3) if records[s]["multi_turn/tool_tokens_mean"] > 0]
    assert went_on, [records[s]["multi_turn/call_rate"] for s in (1, 2, 3)]
    assert all(records[s]["multi_turn/assistant_turns_mean"] > 1 for s in went_on)
