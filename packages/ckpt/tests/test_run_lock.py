"""One run per folder: a second holder is refused while the first lives (another process, the real
flock), a dead holder's lock is taken over with a log line, the lock is re-entrant in one process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import structlog

from grpo_ckpt import FolderInUseError, RunLock, holder_of
from grpo_ckpt.run_lock import LOCK_NAME

HOLDER = textwrap.dedent(
    """
    import sys, time
    from grpo_ckpt import RunLock
    with RunLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def _holder_process(folder: Path, seconds: float) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_run_is_refused_naming_the_live_holder(tmp_path: Path) -> None:
    child = _holder_process(tmp_path, 60)
    try:
        with pytest.raises(FolderInUseError) as info, RunLock(tmp_path, what="--output-dir"):
            pass
        message = str(info.value)
        assert f"pid {child.pid} on " in message and str(tmp_path) in message
        assert "--output-dir" in message
        assert holder_of(tmp_path)["pid"] == child.pid
    finally:
        child.kill()
        child.wait()


def test_a_dead_holders_lock_is_taken_over_and_said(tmp_path: Path) -> None:
    child = _holder_process(tmp_path, 60)
    child.kill()
    child.wait()
    assert holder_of(tmp_path)["pid"] == child.pid  # the record stays: the process died holding it
    with structlog.testing.capture_logs() as logs, RunLock(tmp_path):
        assert holder_of(tmp_path)["pid"] != child.pid
    taken = [e for e in logs if e["event"] == "run_lock.taken_over"]
    assert len(taken) == 1 and taken[0]["previous"]["pid"] == child.pid
    assert taken[0]["why"] == f"pid {child.pid} is not running"
    assert holder_of(tmp_path) is None  # released: an empty file, never deleted
    assert (tmp_path / LOCK_NAME).exists()


def test_a_lock_released_in_order_is_taken_without_a_word(tmp_path: Path) -> None:
    child = _holder_process(tmp_path, 0)
    child.wait()
    with structlog.testing.capture_logs() as logs, RunLock(tmp_path):
        pass
    assert not [e for e in logs if e["event"] == "run_lock.taken_over"]


def test_reentrant_in_one_process_and_free_after_the_outer_release(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        with RunLock(tmp_path / "."):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] > 0
        assert holder_of(tmp_path) is not None  # still held by the outer block
    child = _holder_process(tmp_path, 0)  # another process can take it now
    assert child.wait(timeout=30) == 0


def test_a_record_of_another_host_is_taken_over_when_the_lock_is_free(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "x", "command": "y"}))
    start = time.monotonic()
    with structlog.testing.capture_logs() as logs, RunLock(tmp_path):
        pass
    assert time.monotonic() - start < 5
    (event,) = [e for e in logs if e["event"] == "run_lock.taken_over"]
    assert "another host" in event["why"]
