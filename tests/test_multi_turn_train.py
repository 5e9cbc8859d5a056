"""Multi-turn rollouts through `train()` (issue 45): two ranks on the CPU, colocated `hf` engine,
torch backend; the driver runs the calculator for every replica and each replica samples its own
responses' further turns; the trainer trains on the sampled ids only.

The tiny model is primed to write calculator calls: its output layer leans towards the call's two
tokens and the end of turn (`prime`), because a random model writes a whole call too rarely for a
two-step test. Learning to call is the tiny-tool preset's to show."""

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


def prime(model_dir: Path, strength: float = 3.0) -> None:
    """Add `strength` times the mean direction of the model's last hidden states to the output rows
    of CALL_OPEN, CALL_CLOSE and the end of turn: each becomes likely at every position."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    texts = [f"repeat {d}" for d in tiny_task.DIGITS]
    with torch.no_grad():
        hidden = model.model(**tokenizer(texts, return_tensors="pt", padding=True)).last_hidden_state
        direction = hidden.mean(dim=(0, 1))
        rows = [
            *tokenizer.convert_tokens_to_ids([tiny_model.CALL_OPEN, tiny_model.CALL_CLOSE]),
            tokenizer.eos_token_id,
        ]
        model.lm_head.weight[rows] += strength * direction / direction.norm()
    model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def tool_run(ray_cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multi_turn")
    preset = tiny_preset(workdir)
    model_dir = tiny_model.ensure_tiny_model(workdir / "tool_model", texts=tiny_task.corpus(), tools=True)
    prime(model_dir)
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
