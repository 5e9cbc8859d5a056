"""checkpoint.export_hf with checkpoint.strict on the path training takes: a real PolicyWorker (torch
backend, tiny Qwen3.5-MoE, in this process with world size 1, no Ray) saves a step, then exports.

The strict failure is injected: the model's `save_pretrained` is wrapped to leave one tensor out
(transformers writes every tensor of these models, so no real model fails here; the Megatron-Bridge
failure is tests/test_ckpt_export_qwen35.py, with the real bridge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpo_config
from grpo_ckpt import CheckpointManager, StrictExportError
from grpo_launch import tiny_preset
from grpo_trainer.workers.policy_worker import HF_EXPORT_DIR, PolicyWorker

pytestmark = pytest.mark.timeout(600)

DROPPED = "model.layers.0.mlp.gate.weight"


def _worker(workdir: Path, *overrides: str) -> PolicyWorker:
    cfg = grpo_config.load(tiny_preset(workdir), ["checkpoint.export_hf=true", "device.devices_per_node=1", *overrides])
    worker = PolicyWorker(cfg, rank=0, world_size=1, num_threads=1)
    worker.setup(master_addr="127.0.0.1", master_port=0)
    return worker


def _drop_one_tensor(worker: PolicyWorker) -> None:
    module = worker.actor.backend.module
    save = module.save_pretrained
    state = module.state_dict()
    assert DROPPED in state

    def save_without(path, **kwargs):
        return save(path, state_dict={k: v for k, v in state.items() if k != DROPPED}, **kwargs)

    module.save_pretrained = save_without


def _save(worker: PolicyWorker, step: int) -> None:
    worker.save_checkpoint(step, trainer_state={"global_step": step}, dataloader_state={"epoch": 0, "index": 0})


def test_a_strict_export_failure_keeps_the_training_state_and_names_the_keys(tmp_path) -> None:
    worker = _worker(tmp_path)
    _drop_one_tensor(worker)
    with pytest.raises(StrictExportError) as info:
        _save(worker, 3)
    message = str(info.value)
    assert DROPPED in message and "checkpoint.strict=false" in message
    assert "saved and resumable" in message and "global_step_3" in message
    assert info.value.missing == [DROPPED]

    step_dir = tmp_path / "checkpoints" / "global_step_3"
    outcome = json.loads((step_dir / "manifest.json").read_text())["hf_export"]
    assert outcome == {"status": "failed", "strict": True, "missing": [DROPPED], "unexpected": []}
    manager = CheckpointManager(step_dir.parent)
    assert manager.latest_complete() == step_dir
    loaded = manager.load(step_dir)  # verifies every file's sha256
    assert DROPPED in loaded.model and loaded.trainer_state == {"global_step": 3}
    assert not (step_dir / HF_EXPORT_DIR / "grpo_export_manifest.json").exists()


def test_a_lenient_export_records_the_skipped_key_and_goes_on(tmp_path) -> None:
    worker = _worker(tmp_path, "checkpoint.strict=false")
    _drop_one_tensor(worker)
    _save(worker, 2)
    step_dir = tmp_path / "checkpoints" / "global_step_2"
    outcome = json.loads((step_dir / "manifest.json").read_text())["hf_export"]
    assert outcome["status"] == "ok" and outcome["strict"] is False
    assert outcome["model_keys_not_written"] == [DROPPED]
    export_manifest = json.loads((step_dir / HF_EXPORT_DIR / "grpo_export_manifest.json").read_text())
    assert export_manifest["hf_export"]["model_keys_not_written"] == [DROPPED]


def test_without_export_hf_no_weights_are_exported(tmp_path) -> None:
    worker = _worker(tmp_path, "checkpoint.export_hf=false")
    _save(worker, 1)
    step_dir = tmp_path / "checkpoints" / "global_step_1"
    assert not (step_dir / HF_EXPORT_DIR).exists()
    assert "hf_export" not in json.loads((step_dir / "manifest.json").read_text())


def test_save_contents_chooses_what_the_training_state_holds(tmp_path) -> None:
    """checkpoint.save_contents: without "optimizer" (or "extra") the optimizer (and the LR schedule)
    stay out of the checkpoint; the model is always resumable from it."""
    full = _worker(tmp_path / "full", "checkpoint.export_hf=false")
    _save(full, 1)
    loaded = CheckpointManager(tmp_path / "full" / "checkpoints").load(tmp_path / "full" / "checkpoints" / "global_step_1")
    assert loaded.model and loaded.optimizer is not None and loaded.scheduler is not None
    lean = _worker(tmp_path / "lean", "checkpoint.export_hf=false", "checkpoint.save_contents=[model]")
    _save(lean, 1)
    step_dir = tmp_path / "lean" / "checkpoints" / "global_step_1"
    loaded = CheckpointManager(step_dir.parent).load(step_dir)
    assert loaded.model and loaded.optimizer is None and loaded.scheduler is None
    assert json.loads((step_dir / "manifest.json").read_text())["components"] == ["dataloader", "model"]
