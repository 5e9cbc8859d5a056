"""The algorithms through `train()` as the launchers run it (tiny preset, 2 Ray ranks, CPU):
GSPO with truncated importance sampling, rejection masking, DAPO's dynamic sampling, overlong
shaping and filtering, and the adaptive KL penalty in the reward, all on at once. Their metrics
land in metrics.jsonl and TensorBoard, and the KL coefficient survives a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer import read_metrics, train
from grpo_trainer.workers.group import ensure_ray

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ALL_ON = [
    "data.train_batch_size=8",
    "data.gen_batch_size=8",
    "actor.ppo_mini_batch_size=4",
    "actor.ppo_micro_batch_size_per_device=16",
    "test_freq=-1",
    "checkpoint.save_freq=2",
    "actor.policy_loss.loss_mode=gspo",
    "actor.loss_agg_mode=seq-mean-token-mean",
    "algorithm.rollout_correction.rollout_is=sequence",
    "algorithm.rollout_correction.rollout_rs=token_k1",
    "algorithm.rollout_correction.rollout_rs_threshold=2.0",
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "reward.overlong_buffer.enable=true",
    "reward.overlong_buffer.len=2",
    "reward.overlong_buffer.penalty_factor=0.1",
    "reward.overlong_buffer.log=true",
    "algorithm.overlong_filter=true",
    "algorithm.use_kl_in_reward=true",
    "algorithm.kl_ctrl.type=adaptive",
    "algorithm.kl_ctrl.kl_coef=0.01",
    "algorithm.kl_ctrl.target_kl=0.001",
    "algorithm.kl_ctrl.horizon=256",
]


def _tensorboard_tags(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in folder.glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags


def test_every_algorithm_on_writes_its_metrics_and_resumes_its_kl_coefficient(tmp_path: Path) -> None:
    import ray

    started = ensure_ray(num_cpus=2)
    try:
        first = train(grpo_config.load(tiny_preset(tmp_path), [*ALL_ON, "total_training_steps=2"]))
        records = read_metrics(first.metrics_path)
        assert list(records) == [1, 2]
        for step, record in records.items():
            assert record["train/num_gen_batches"] >= 1
            generated, dropped = record["dynamic_sampling/groups_generated"], record["dynamic_sampling/groups_dropped"]
            assert generated == 8 * record["train/num_gen_batches"]
            assert dropped <= generated - 8, step  # at least the 8 groups a step trains were kept
            assert record["dynamic_sampling/groups_kept_unused"] >= 0
            assert record["rollout_corr/rollout_is_mean"] > 0
            assert 0 <= record["rollout_corr/rollout_rs_masked_fraction"] <= 1
            assert 0 <= record["rollout/overlong_filtered_fraction"] <= 1
            assert record["reward/overlong_penalty_mean"] <= 0
            assert record["actor/pg_clipfrac_lower"] == 0.0  # GSPO has no dual clip
            for name in ("kl", "k3_kl", "training_ppl", "rollout_ppl", "chi2_token", "max_abs_log_prob_diff"):
                assert f"rollout_corr/{name}" in record
        # Step 1: policy == reference, KL 0, below target: the adaptive coefficient shrinks.
        assert records[1]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
        assert records[1]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.01)
        assert records[2]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.01 * (1 - 0.2 * 64 / 256))  # 8 prompts x n=8
        tags = _tensorboard_tags(tmp_path / "runs" / "tensorboard" / "grpo" / "tiny")
        for tag in (
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_eff_sample_size",
            "rollout_corr/rollout_rs_masked_fraction",
            "rollout_corr/kl",
            "train/num_gen_batches",
            "dynamic_sampling/groups_dropped",
            "actor/reward_kl_penalty_coeff",
        ):
            assert tag in tags, tag
        state = json.loads((first.checkpoint_dir / "global_step_2" / "trainer_state.json").read_text())
        saved = state["kl_controller"]["value"]
        assert saved < 0.01

        resumed = train(grpo_config.load(tiny_preset(tmp_path), [*ALL_ON, "total_training_steps=3"]))
        assert resumed.resumed_from is not None and resumed.final_step == 3
        assert read_metrics(resumed.metrics_path)[3]["actor/reward_kl_penalty_coeff"] == pytest.approx(saved)
    finally:
        if started:
            ray.shutdown()
