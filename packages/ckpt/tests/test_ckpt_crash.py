"""Crash safety of grpo_ckpt.CheckpointManager, end to end with real processes and SIGKILL.

A child process resumes from the newest complete checkpoint and saves step after step (with
retention on, so deletions are interrupted too); the parent SIGKILLs it after a random delay, 20
times. After every kill, resume=auto must find a complete checkpoint whose tensors (re-hashed and
compared with what that step saved) are exactly right.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from grpo_ckpt import CheckpointManager

KILLS = 20


def _state(step: int) -> dict:
    gen = torch.Generator().manual_seed(step)
    return {
        "model": {
            "embed.weight": torch.randn(512, 256, generator=gen).to(torch.bfloat16),
            "layers.0.mlp.weight": torch.randn(256, 256, generator=gen),
        },
        "optimizer": {
            "state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(256, 256, generator=gen)}},
            "param_groups": [{"lr": 1e-3, "params": [0]}],
        },
        "scheduler": {"last_epoch": step},
        "trainer_state": {"global_step": step},
        "dataloader_state": {"index": step * 8},
    }


def _train_and_save_forever(root: str, start_step: int) -> None:
    torch.set_num_threads(1)  # one thread per child: the parent runs tests beside it
    manager = CheckpointManager(root, max_to_keep=2)
    step = start_step
    while True:
        step += 1
        manager.save(step, **_state(step))


def _assert_matches_saved(loaded: object) -> None:
    expected = _state(loaded.step)
    for name, tensor in expected["model"].items():
        assert torch.equal(loaded.model[name], tensor), name
    got_opt = loaded.optimizer["state"][0]
    for name, tensor in expected["optimizer"]["state"][0].items():
        assert torch.equal(got_opt[name], tensor), name
    assert loaded.scheduler == expected["scheduler"]
    assert loaded.trainer_state == expected["trainer_state"]
    assert loaded.dataloader_state == expected["dataloader_state"]


@pytest.mark.timeout(120)
def test_sigkill_during_save_always_leaves_a_complete_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root, max_to_keep=2)
    manager.save(0, **_state(0))
    chooser = random.Random(20261202)
    # Children fork from a fresh server process with torch and grpo_ckpt loaded: this process
    # may hold OpenMP threads, and, once an in-process vLLM CPU engine ran in it (vLLM replaces
    # torch.set_num_threads there), a plain fork's child could not leave them behind.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "grpo_ckpt", _train_and_save_forever.__module__])
    steps, interrupted = [], 0
    started = time.monotonic()
    for _ in range(KILLS):
        resume_from = manager.load(manager.resolve_resume("auto"), verify=False).step
        child = ctx.Process(target=_train_and_save_forever, args=(str(root), resume_from), daemon=True)
        child.start()
        time.sleep(chooser.uniform(0.05, 0.8))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL

        interrupted += any(mf_missing(p) for _, p in manager.step_dirs())
        path = manager.resolve_resume("auto")
        assert path is not None
        loaded = manager.load(path)  # re-hashes every file against the manifest
        _assert_matches_saved(loaded)
        assert loaded.step >= resume_from
        steps.append(loaded.step)

    # The test has teeth only if kills landed mid-save and saves made progress between kills.
    assert interrupted >= KILLS // 4, (interrupted, steps)
    assert steps[-1] >= 5, steps
    print(f"{KILLS} kills in {time.monotonic() - started:.1f} s; {interrupted} mid-save; resumed steps {steps}")


def mf_missing(step_dir: Path) -> bool:
    return not (step_dir / "manifest.json").exists()
