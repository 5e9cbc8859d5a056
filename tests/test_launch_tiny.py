"""`--preset tiny` end to end through each installed launcher on the CPU: the tiny preset builds its
model and task under --output-dir, the launcher resolves and runs it, and the run leaves metrics and
a checkpoint behind. Shortened with a dotted override (the full tiny run's learning curve is the
trainer's own test); skipped until grpo_launch's tiny preset is importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 3


def _tiny_available() -> bool:
    try:
        from grpo_launch import tiny_preset  # noqa: F401
        from grpo_trainer.trainer import train  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _tiny_available(), reason="grpo_launch.tiny_preset / train not there yet")
@pytest.mark.parametrize("launcher", ["grpo-launch-35b", "grpo-launch-122b"])
@pytest.mark.timeout(900)
def test_tiny_preset_runs_to_completion(launcher: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "RAY_ADDRESS")}
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name(launcher)),
            "--preset",
            "tiny",
            "--output-dir",
            str(out),
            "--",
            f"total_training_steps={STEPS}",
            "checkpoint.save_freq=1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=850,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    finished = [e for e in events if e.get("event") == "training finished"]
    assert len(finished) == 1 and finished[0]["result"]["final_step"] == STEPS
    metrics = list(out.rglob("*.jsonl"))
    assert metrics, f"no metrics JSONL under {out}"
    assert list(out.rglob("global_step_*")), f"no checkpoint under {out}"


def _json_events(stderr: str) -> list[dict]:
    """Every JSON log line, the driver's and the workers' (Ray prefixes those with the actor)."""
    events = []
    for line in stderr.splitlines():
        start = line.find("{")
        if start >= 0:
            try:
                events.append(json.loads(line[start:]))
            except json.JSONDecodeError:
                continue
    return events


@pytest.mark.skipif(not _tiny_available(), reason="grpo_launch.tiny_preset / train not there yet")
@pytest.mark.timeout(900)
def test_logging_level_reaches_the_driver_and_every_worker(tmp_path: Path) -> None:
    """logging.level (or --log-level) configures the driver and, through Ray's worker set-up hook,
    every worker process: debug shows the workers' debug events, warning hides everyone's info."""
    launcher = str(Path(sys.executable).with_name("grpo-launch-35b"))
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "RAY_ADDRESS")}
    runs = {}
    for level, extra in (("debug", ["--log-level", "debug"]), ("warning", [])):
        overrides = ["total_training_steps=1", *([] if extra else [f"logging.level={level}"])]
        proc = subprocess.run(
            [launcher, "--preset", "tiny", "--output-dir", str(tmp_path / level), *extra, "--", *overrides],
            capture_output=True,
            text=True,
            env=env,
            timeout=850,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[level] = _json_events(proc.stderr)
    worker_debug = [e for e in runs["debug"] if e.get("event") == "ckpt.component_saved"]
    assert worker_debug and all(e["level"] == "debug" for e in worker_debug)  # saved by the workers
    assert any(e.get("event") == "worker.ready" for e in runs["debug"])
    assert not [e for e in runs["warning"] if e.get("level") in ("debug", "info")]
    assert (tmp_path / "warning" / "checkpoints" / "global_step_1").is_dir()  # it did run
