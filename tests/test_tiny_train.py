"""The tiny preset through `train()` end to end on CPU (2 Ray workers, data parallel over gloo),
shortened to a few steps: artifacts, determinism, and resume after a SIGKILL.

The full, unshortened preset (test_full_tiny_run_learns, ~1 min on 2 idle cores) must finish
within 10 minutes with the mean reward of its last 10 steps >= that of its first 10 + 0.5."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer import TrainResult, WorkerError, read_metrics, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 6
# Smaller than the preset (8 prompts x 8 samples), still two mini-batches and two ranks.
OVERRIDES = [
    f"total_training_steps={STEPS}",
    "data.train_batch_size=8",
    "actor.ppo_mini_batch_size=4",
    "actor.ppo_micro_batch_size_per_device=16",
    "checkpoint.save_freq=2",
    "checkpoint.export_hf=true",
    "test_freq=3",
]
CHILD = """
import sys
from pathlib import Path
import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer import train
train(grpo_config.load(tiny_preset(Path(sys.argv[1])), sys.argv[2:]))
"""


def _run(workdir: Path, overrides: list[str]) -> TrainResult:
    return train(grpo_config.load(tiny_preset(workdir), overrides))


@pytest.fixture(scope="module")
def run_a(ray_cluster, tmp_path_factory) -> tuple[Path, TrainResult]:
    """With Weights & Biases in offline mode (its files in the run folder, no network) and two
    validation samples logged per validation."""
    workdir = tmp_path_factory.mktemp("run_a")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        extra = ["val_before_train=true", "logging.wandb=true", "logging.val_generations=2"]
        return workdir, _run(workdir, [*OVERRIDES, *extra])


def test_run_writes_checkpoints_metrics_tensorboard_and_plot(run_a) -> None:
    workdir, result = run_a
    assert result.final_step == STEPS and result.resumed_from is None
    assert list(result.rewards) == list(range(1, STEPS + 1))
    assert all(0.0 <= r <= 1.0 for r in result.rewards.values())
    ckpts = sorted(p.name for p in result.checkpoint_dir.glob("global_step_*"))
    assert ckpts == ["global_step_4", "global_step_6"]  # save_freq=2, max_to_keep=2
    assert (result.checkpoint_dir / "latest").read_text().strip() == "global_step_6"
    state = json.loads((result.checkpoint_dir / "global_step_6" / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    model_config = json.loads((result.checkpoint_dir / "global_step_6" / "transformer_config.json").read_text())
    assert model_config["model_type"].startswith("qwen3")  # the policy's own (HF) config
    # ppo_mini_batch_size=4 of train_batch_size=8 prompts, ppo_epochs=1: two optimizer steps a step.
    from grpo_ckpt import CheckpointManager

    optimizer = CheckpointManager(result.checkpoint_dir).load(result.checkpoint_dir / "global_step_6").optimizer
    assert {int(s["step"]) for s in optimizer["state"].values()} == {2 * STEPS}
    records = read_metrics(result.metrics_path)
    assert list(records) == list(range(0, STEPS + 1))  # step 0: val_before_train
    for key in (
        "reward/mean",
        "actor/kl",
        "actor/pg_loss",
        "actor/entropy",
        "response_length/mean",
        *(
            f"timing/{phase}_s"
            for phase in ("generate", "reward", "advantages", "old_log_probs", "ref_log_probs", "update", "weight_sync", "step")
        ),
    ):
        assert key in records[1], key
    # Saves at steps 2, 4, 6 and validation at 3, 6: their times are in those steps' records only.
    assert {s for s, r in records.items() if "timing/save_s" in r} == {2, 4, 6}
    assert {s for s, r in records.items() if "timing/validate_s" in r} == {3, 6}
    assert records[1]["rollout/logprob_abs_diff"] < 1e-3  # engine and trainer agree on log-probs
    assert {s for s, r in records.items() if "val/reward_mean" in r} == {0, 3, 6}
    assert set(records[0]) == {key for key in records[3] if key.startswith("val/")}
    assert result.plot_path is not None and result.plot_path.read_bytes()[:4] == b"\x89PNG"
    # project_name / experiment_name ("grpo" / "tiny" in the preset) name the run's folders.
    assert result.metrics_path == workdir / "runs" / "grpo" / "tiny" / "metrics.jsonl"
    assert result.plot_path == workdir / "runs" / "grpo" / "tiny" / "metrics.png"
    assert list((workdir / "runs" / "tensorboard" / "grpo" / "tiny").glob("events.out.tfevents.*"))


def _wandb_records(run_folder: Path) -> tuple[dict[str, str], dict[int, dict[str, str]]]:
    """The offline run's config and its history (step -> key -> JSON text), read back with wandb's
    own record reader."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = run_folder.glob("wandb/offline-run-*/run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    config, history = {}, {}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config = {item.key: item.value_json for item in record.run.config.update}
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            history.setdefault(int(items["_step"]), {}).update(items)
    return config, history


def test_wandb_and_validation_samples_carry_the_run(run_a) -> None:
    """logging.wandb (verl's trainer.logger 'wandb'): a run named by project / experiment, with the
    resolved config and every step's metrics as metrics.jsonl has them; logging.val_generations=2
    (verl's log_val_generations): two (prompt, response, score) samples per validation in
    val_generations.jsonl, TensorBoard and the wandb table val/generations."""
    workdir, result = run_a
    run_folder = workdir / "runs" / "grpo" / "tiny"
    config, history = _wandb_records(run_folder)
    assert json.loads(config["project_name"]) == "grpo" and json.loads(config["experiment_name"]) == "tiny"
    assert json.loads(config["logging"])["val_generations"] == 2
    records = read_metrics(result.metrics_path)
    assert sorted(history) == list(records)
    for step, row in records.items():
        assert json.loads(history[step]["reward/mean" if step else "val/reward_mean"]) == pytest.approx(
            row["reward/mean" if step else "val/reward_mean"]
        )
    assert {s for s, items in history.items() if "val/generations/_type" in items} == {0, 3, 6}
    assert json.loads(history[6]["val/generations/nrows"]) == 3  # one row per validation, verl's table
    lines = [json.loads(line) for line in (run_folder / "val_generations.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 3, 6]
    for line in lines:
        assert len(line["samples"]) == 2
        for sample in line["samples"]:
            assert sample["input"] and 0.0 <= sample["score"] <= 1.0 and isinstance(sample["output"], str)
    # The same prompts each time (sorted, shuffled with verl's fixed seed), the responses of that step.
    assert len({tuple(s["input"] for s in line["samples"]) for line in lines}) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(workdir / "runs" / "tensorboard" / "grpo" / "tiny"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.step for e in events.Tensors("val/generations/text_summary")] == [0, 3, 6]


def test_every_save_exports_the_trained_policy_as_hf_weights(run_a) -> None:
    """checkpoint.export_hf: each save writes `huggingface/` after the training state; transformers
    loads it and gives the logits of the checkpoint's trained weights (not the initial ones)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_ckpt import CheckpointManager

    workdir, result = run_a
    for name in ("global_step_4", "global_step_6"):
        step_dir = result.checkpoint_dir / name
        outcome = json.loads((step_dir / "manifest.json").read_text())["hf_export"]
        assert outcome["status"] == "ok" and outcome["strict"] is True
        assert outcome["model_keys_not_written"] == [] and outcome["written"] > 0
        hf = step_dir / "huggingface"
        assert (hf / "config.json").is_file() and (hf / "tokenizer_config.json").is_file()
        assert list(hf.glob("*.safetensors"))
    step_dir = result.checkpoint_dir / "global_step_6"
    initial_path = tiny_preset(workdir)["actor"]["model_path"]
    exported = AutoModelForCausalLM.from_pretrained(step_dir / "huggingface", dtype=torch.float32)
    trained = AutoModelForCausalLM.from_pretrained(initial_path, dtype=torch.float32)
    trained.load_state_dict(CheckpointManager(result.checkpoint_dir).load(step_dir).model)
    initial = AutoModelForCausalLM.from_pretrained(initial_path, dtype=torch.float32)
    ids = torch.tensor([[3, 5, 7, 9, 11, 2, 4]])
    with torch.no_grad():
        logits = exported(input_ids=ids).logits
        assert torch.equal(logits, trained(input_ids=ids).logits)
        assert not torch.allclose(logits, initial(input_ids=ids).logits)


def test_same_seed_gives_identical_rewards(run_a, tmp_path) -> None:
    _, first = run_a
    again = _run(tmp_path, [*OVERRIDES[1:], "total_training_steps=5"])
    assert list(again.rewards.values()) == list(first.rewards.values())[:5]


def test_sigkill_mid_run_then_rerun_resumes_from_the_last_checkpoint(run_a, tmp_path) -> None:
    """A child process is killed (with its Ray processes: its whole process group) once step 2's
    checkpoint is complete; the rerun continues from it and retraces the uninterrupted run."""
    _, uninterrupted = run_a
    marker = tmp_path / "checkpoints" / "global_step_2" / "manifest.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), *OVERRIDES],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while not marker.exists():
            assert child.poll() is None, f"child exited with {child.returncode} before a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 600 s"
            time.sleep(0.2)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    steps_before = sorted(
        int(p.name.rsplit("_", 1)[1]) for p in (tmp_path / "checkpoints").glob("global_step_*")
    )
    assert steps_before and max(steps_before) < STEPS, "the child finished before it was killed"

    resumed = _run(tmp_path, OVERRIDES)
    assert resumed.resumed_from is not None
    assert resumed.resumed_from.name.startswith("global_step_")
    assert resumed.final_step == STEPS
    assert resumed.rewards == uninterrupted.rewards
    assert list(read_metrics(resumed.metrics_path)) == list(range(1, STEPS + 1))


def test_a_run_killed_between_save_and_metrics_record_writes_the_record_on_resume(run_a, tmp_path) -> None:
    """The checkpoint carries its step's metrics: with the last JSONL record lost (as if the driver
    died right after the save), resuming from that checkpoint writes the record back."""
    workdir, first = run_a
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    jsonl = copy / "runs" / "grpo" / "tiny" / "metrics.jsonl"
    lines = jsonl.read_text().splitlines()
    assert json.loads(lines[-1])["step"] == STEPS
    jsonl.write_text("\n".join(lines[:-1]) + "\n")
    assert STEPS not in read_metrics(jsonl)

    resumed = _run(copy, OVERRIDES)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == f"global_step_{STEPS}"
    records = read_metrics(jsonl)
    assert list(records) == list(range(0, STEPS + 1))
    assert records[STEPS]["reward/mean"] == first.rewards[STEPS]
    assert "timing/update_s" in records[STEPS]


def test_a_worker_that_fails_stops_train_with_its_traceback(ray_cluster, tmp_path) -> None:
    """The driver reads only the tokenizer; the workers' model load fails (weights removed), and
    train() raises promptly with the worker's own error instead of hanging."""
    raw = tiny_preset(tmp_path)
    broken = tmp_path / "broken_model"
    shutil.copytree(raw["actor"]["model_path"], broken)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    raw["actor"]["model_path"] = str(broken)
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        train(grpo_config.load(raw, OVERRIDES))
    assert time.monotonic() - started < 300
    message = str(info.value)
    assert "setup failed on rank" in message and "all workers were stopped" in message
    assert "from_pretrained" in message  # the worker's traceback, not just "actor died"


def test_a_phase_past_its_timeout_stops_train_with_the_ranks_stacks(ray_cluster, tmp_path) -> None:
    """`timeouts.update_s` bounds the update phase: past it, train() stops at once with
    WorkerTimeoutError naming the phase, the setting and the silent ranks' Python stacks."""
    from grpo_trainer import WorkerTimeoutError

    started = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        _run(tmp_path, [*OVERRIDES, "timeouts.update_s=0.05"])
    assert time.monotonic() - started < 300
    message = str(info.value)
    assert "update: ranks [0, 1] gave no answer within 0.05 s" in message
    assert "timeouts.update_s" in message
    # Each silent rank's stack (where it is by then: the update takes longer than 0.05 s, but it
    # may have finished before the stack is read; test_worker_group checks a rank that stays stuck).
    assert message.count("--- rank ") == 2 and message.count("(most recent call first)") >= 2


@pytest.mark.timeout(1200)
def test_full_tiny_run_learns(ray_cluster, tmp_path) -> None:
    result = _run(tmp_path, [])
    rewards = list(result.rewards.values())
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(
        f"tiny preset: {result.final_step} steps in {result.wall_time_s:.0f} s, reward {first:.3f} -> {last:.3f}"
    )
    assert result.wall_time_s < 600
    assert last - first >= 0.5
