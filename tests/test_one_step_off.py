"""rollout.mode=one_step_off through `train()` on CPU: one training rank and one rollout worker of
its own (two Ray processes, the `hf` engine in float32), the tiny preset shortened.

What is shown: the first step's responses come from the starting weights (no gap between the
rollout engine's log-probs and the policy's), every later step's from the weights one update
behind (`rollout/staleness` 1 and a gap the TIS weights correct); validation waits for the
generation in flight and sees the current weights; a checkpoint taken while the next step's
prompts are out is resumed with those prompts drawn again and the rollout worker given the
checkpoint's weights (no gap at the first resumed step)."""

from __future__ import annotations

from pathlib import Path

import pytest

import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer import TrainResult, read_metrics, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 5
BATCH = 8
OVERRIDES = [
    "device.devices_per_node=1",
    "rollout.mode=one_step_off",
    "rollout.devices_per_node=1",
    "algorithm.rollout_correction.rollout_is=token",
    f"data.train_batch_size={BATCH}",
    "actor.ppo_mini_batch_size=4",
    "checkpoint.save_freq=2",
    "test_freq=3",
    "logging.tensorboard=false",
    "logging.plot=false",
]
# The tiny preset's float32 hf engine on the starting weights matches the policy's log-probs to
# this; one update at lr 1e-3 moves them far more (measured: 0.08-0.16 mean abs per token).
SAME_WEIGHTS = 1e-5
ONE_UPDATE_BEHIND = 1e-3


@pytest.fixture(scope="module")
def first_run(ray_cluster, tmp_path_factory) -> tuple[Path, TrainResult]:
    workdir = tmp_path_factory.mktemp("one_step_off")
    cfg = grpo_config.load(tiny_preset(workdir), [*OVERRIDES, f"total_training_steps={STEPS}"])
    return workdir, train(cfg)


def test_each_step_trains_on_responses_of_the_weights_one_update_behind(first_run) -> None:
    _, result = first_run
    records = read_metrics(result.metrics_path)
    assert result.final_step == STEPS
    assert [records[s]["rollout/staleness"] for s in range(1, STEPS + 1)] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert records[1]["rollout/logprob_abs_diff"] < SAME_WEIGHTS
    assert all(records[s]["rollout/logprob_abs_diff"] > ONE_UPDATE_BEHIND for s in range(2, STEPS + 1))
    for step in range(2, STEPS + 1):  # token-level TIS weights away from 1 correct the gap
        assert records[step]["rollout_corr/rollout_is_std"] > 0
        assert records[step]["timing/generate_s"] > 0 and "timing/generate_wait_s" in records[step]
    # Step 1 waits for its own generation; the rollout worker got new weights before each later one
    # (timed as weight_sync) except after a validation (step 3's sent them already).
    assert records[1]["timing/generate_wait_s"] > 0.5 * records[1]["timing/generate_s"]
    assert [s for s in range(1, STEPS + 1) if "timing/weight_sync_s" not in records[s]] == [1, 4]
    assert {s for s in records if "val/reward_mean" in records[s]} == {3, 5}


def test_a_checkpoint_holds_the_sampler_before_the_prompts_in_flight(first_run) -> None:
    from grpo_ckpt import CheckpointManager

    _, result = first_run
    manager = CheckpointManager(result.checkpoint_dir)
    for step in (4, 5):
        # Step 4's save happened with step 5's prompts out: they are drawn again on resume.
        state = manager.load(result.checkpoint_dir / f"global_step_{step}").dataloader_state
        assert state is not None and state["position"] == step * BATCH


def test_resume_sends_the_checkpoint_weights_before_generating(first_run) -> None:
    workdir, _ = first_run
    cfg = grpo_config.load(tiny_preset(workdir), [*OVERRIDES, f"total_training_steps={STEPS + 2}"])
    result = train(cfg)
    assert result.resumed_from is not None and result.resumed_from.name == f"global_step_{STEPS}"
    records = read_metrics(result.metrics_path)
    assert records[STEPS + 1]["rollout/staleness"] == 0.0
    assert records[STEPS + 1]["rollout/logprob_abs_diff"] < SAME_WEIGHTS  # not the starting weights
    assert records[STEPS + 2]["rollout/staleness"] == 1.0


def test_a_cluster_without_the_rollout_devices_is_refused_at_once(ray_cluster, monkeypatch) -> None:
    """The device check before the rollout workers' placement; a Ray cluster reporting one GPU
    stands in for a GPU cluster (there is none here)."""
    import ray

    from grpo_trainer.workers.group import WorkerError
    from grpo_trainer.workers.rollout_workers import RolloutWorkers

    cfg = grpo_config.load(
        None,
        [
            "device.kind=cuda", "device.devices_per_node=1", "rollout.mode=one_step_off", "rollout.devices_per_node=2",
            "algorithm.rollout_correction.rollout_is=token", "rollout.free_cache_engine=false",
        ],
    )
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    with pytest.raises(WorkerError, match=r"needs 1 GPU for training .* and 2 more for the rollout workers .* has 1"):
        RolloutWorkers(cfg)
