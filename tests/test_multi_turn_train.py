"""Multi-turn rollouts through `train()` (issue 45): two ranks on the CPU, colocated `hf` engine,
torch backend; the driver runs the calculator for every replica and each replica samples its own
responses' further turns; the trainer trains on the sampled ids only.

The tiny model is primed to write calculator calls (`grpo_tiny.model.prime_tool_calls`). The same
step on vLLM with the Megatron actor: tests/test_vllm_replicas.py."""

from __future__ import annotations

import math

import pytest

import grpo_config
from grpo_launch import tiny_preset
from grpo_tiny import model as tiny_model
from grpo_tiny import task as tiny_task
from grpo_trainer import read_metrics, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def tool_run(ray_cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multi_turn")
    preset = tiny_preset(workdir)
    model_dir = tiny_model.ensure_tiny_model(workdir / "tool_model", texts=tiny_task.corpus(), tools=True)
    tiny_model.prime_tool_calls(model_dir, prompts=[f"repeat {d}" for d in tiny_task.DIGITS])
    overrides = [
        f"actor.model_path={model_dir}",
        "total_training_steps=2",
        "test_freq=-1",
        "data.train_batch_size=8",
        "data.max_prompt_length=24",
        "data.max_response_length=128",
        "actor.ppo_mini_batch_size=8",
        "actor.lr=1e-6",  # the priming must hold for both steps
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.tools=[calculator]",
        "rollout.multi_turn.max_assistant_turns=3",
        "rollout.multi_turn.max_tool_response_length=8",
        "rollout.multi_turn.tool_timeout_s=5",
    ]
    result = train(grpo_config.load(preset, overrides))
    return result, read_metrics(result.metrics_path)


def test_a_step_calls_tools_and_trains_on_the_sampled_ids_only(tool_run) -> None:
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
