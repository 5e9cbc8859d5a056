"""One run per folder: an exclusive lock held for a whole run, so that two runs never write the
same checkpoints, metrics or tiny model.

The lock is `fcntl.flock` on `<folder>/.grpo-run.lock`, which records its holder (pid, host, start,
command). The kernel releases a flock when its holder dies, so a lock left by a killed run is free:
the next run takes it over and logs whose it was. The file is never deleted (deleting it would let
two runs lock two different files); a released lock is an empty file. Re-entrant within one process
(the launcher holds its output folder while `train()` locks the checkpoint folder inside it).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger()

LOCK_NAME = ".grpo-run.lock"

_held: dict[Path, tuple[int, int]] = {}  # lock file -> (fd, depth) of the locks this process holds
_guard = threading.Lock()


class FolderInUseError(ValueError):
    """Another live run holds the folder; the message names it and what to do."""


def holder_of(folder: str | Path) -> dict[str, Any] | None:
    """The recorded holder of `folder`'s lock (None when the file is empty or missing). Whether it
    is alive is the lock's business, not this record's."""
    try:
        text = (Path(folder) / LOCK_NAME).read_text()
    except OSError:
        return None
    try:
        record = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


class RunLock:
    """`with RunLock(folder, what="--output-dir"):` holds `folder` for the block or raises
    FolderInUseError (exit 2 at the launcher) naming the live holder. `what` names the setting
    that chose the folder, for the message."""

    def __init__(self, folder: str | Path, *, what: str = "the output folder") -> None:
        self.folder = Path(folder).absolute()
        self.path = self.folder / LOCK_NAME
        self.what = what

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        with _guard:
            if self.path in _held:
                fd, depth = _held[self.path]
                _held[self.path] = (fd, depth + 1)
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise FolderInUseError(self._in_use_message(holder_of(self.folder))) from None
            except BaseException:
                os.close(fd)
                raise
            previous = holder_of(self.folder)
            if previous is not None:
                log.warning(
                    "run_lock.taken_over",
                    folder=str(self.folder),
                    previous=previous,
                    why=_why_stale(previous),
                )
            _write_record(fd)
            _held[self.path] = (fd, 1)

    def release(self) -> None:
        with _guard:
            fd, depth = _held.get(self.path, (-1, 0))
            if depth == 0:
                return
            if depth > 1:
                _held[self.path] = (fd, depth - 1)
                return
            del _held[self.path]
            try:
                os.ftruncate(fd, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _in_use_message(self, holder: dict[str, Any] | None) -> str:
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: "
            f"{holder.get('command')}"
            if holder
            else "a process that has not written its name yet"
        )
        return (
            f"{self.folder} is in use by another run ({who}). Wait for that run to end or stop it, "
            f"or give this run a folder of its own ({self.what})."
        )


def _record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv)[:500],
    }


def _write_record(fd: int) -> None:
    data = (json.dumps(_record()) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _why_stale(previous: dict[str, Any]) -> str:
    if previous.get("host") != socket.gethostname():
        return "the lock was free (a run on another host that ended without releasing it)"
    pid = previous.get("pid")
    try:
        os.kill(int(pid), 0)  # type: ignore[arg-type]
    except (ProcessLookupError, TypeError, ValueError):
        return f"pid {pid} is not running"
    except PermissionError:
        pass
    return f"pid {pid} runs but no longer holds the lock (a reused pid)"
