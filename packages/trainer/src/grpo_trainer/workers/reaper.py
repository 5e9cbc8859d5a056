"""Ray's processes end with the driver that started them. A local Ray cluster (started by
`train()`, no RAY_ADDRESS) runs as the driver's child processes: GCS, raylet, dashboard and
runtime-env agents. When the driver is killed (`kill -9`, the OOM killer) they notice by themselves
only after ~60 s (measured: docs/RELIABILITY.md). A small watcher process, started right after
`ray.init`, waits for the driver's pid to go and then ends those processes (the workers end with
their raylet). Linux only (it reads /proc); elsewhere nothing is started.

    python .../grpo_trainer/workers/reaper.py DRIVER_PID PID [PID ...]    (stdlib only: no package import)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
TERM_GRACE_S = 3.0


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def start_reaper() -> subprocess.Popen[bytes] | None:
    """Watch this process; when it is gone, end the Ray processes it has started so far."""
    if not Path("/proc/self/stat").exists():
        return None
    me = os.getpid()
    ray_pids = [
        pid
        for pid in descendants(me)
        if b"ray" in (cmd := _cmdline(pid) or b"") and __file__.encode() not in cmd  # an earlier watcher is no Ray process
    ]
    if not ray_pids:
        return None
    return subprocess.Popen(
        [sys.executable, __file__, str(me), *map(str, ray_pids)],
        start_new_session=True,  # not in the driver's process group: a Ctrl-C there does not end it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reap(driver: int, pids: list[int]) -> None:
    identities = {pid: _cmdline(pid) for pid in pids}
    while _alive(driver):
        time.sleep(POLL_S)
    # The same processes still (a pid reused since would have another command line).
    mine = [pid for pid, cmd in identities.items() if cmd is not None and _cmdline(pid) == cmd]
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 0.0)):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(pid) for pid in mine):
            time.sleep(0.1)


if __name__ == "__main__":
    reap(int(sys.argv[1]), [int(p) for p in sys.argv[2:]])
