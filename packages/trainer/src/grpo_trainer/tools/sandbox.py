"""One tool call in a fresh subprocess: a wall-clock timeout (the process group is killed), an
address-space and a CPU-time limit, no network (a network namespace of its own) where the OS allows,
and output cut at a byte budget. A timeout, a crash or a limit hit is a result, never an exception:
the model reads the message and the step goes on. `enforced()` says which limits hold here."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    cpu_s: int | None = None  # RLIMIT_CPU; None: the timeout rounded up, plus 1 s
    max_output_bytes: int = 16384
    network: bool = False


@dataclass(frozen=True)
class ToolResult:
    status: Status
    text: str
    seconds: float
    truncated: bool = False


def _jail_command() -> list[str]:
    return [sys.executable, "-I", "-m", "grpo_trainer.tools._jail"]


def _child_env() -> dict[str, str]:
    # Nothing of the trainer's environment but what Python needs; one BLAS thread under RLIMIT_AS.
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")}
    return {**keep, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def run(request: dict[str, Any], limits: Limits) -> ToolResult:
    """Run one jail request (`_jail`'s protocol) under `limits`."""
    started = time.monotonic()
    payload = json.dumps({"limits": asdict(limits), **request}).encode()
    try:
        proc = subprocess.Popen(
            _jail_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            start_new_session=True,  # its own process group: a timeout kills what it started too
        )
    except OSError as exc:  # no process, memory or file handle left: an answer, not a crash
        return ToolResult("error", f"the tool could not start: {exc}", time.monotonic() - started)
    try:
        out, _ = proc.communicate(payload, timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        text, truncated = _cut(out, limits.max_output_bytes)
        return ToolResult(
            "timeout",
            f"timed out after {limits.timeout_s:g} s" + (f"; output so far:\n{text}" if text else ""),
            time.monotonic() - started,
            truncated,
        )
    seconds = time.monotonic() - started
    text, truncated = _cut(out, limits.max_output_bytes)
    if proc.returncode == 0:
        return ToolResult("ok", text, seconds, truncated)
    return ToolResult("error", text or _describe_exit(proc.returncode), seconds, truncated)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
        os.killpg(proc.pid, signal.SIGKILL)


def _cut(raw: bytes, budget: int) -> tuple[str, bool]:
    if len(raw) <= budget:
        return raw.decode("utf-8", errors="replace").rstrip("\n"), False
    return raw[:budget].decode(
        "utf-8", errors="ignore"
    ) + f"\n... [cut: {len(raw) - budget} more bytes]", True


def _describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        why = {"SIGXCPU": "its CPU-time limit", "SIGKILL": "a kill (memory or CPU limit)"}.get(name, name)
        return f"the tool process ended by {why}"
    return f"the tool process exited with status {code}"


@functools.cache
def enforced() -> dict[str, bool]:
    """Which of the limits this machine enforces, found by running the jail once (cached)."""
    result = run({"kind": "probe"}, Limits(timeout_s=30.0))
    try:
        found = json.loads(result.text.splitlines()[-1])
    except (ValueError, IndexError):
        return {"timeout": True, "memory": False, "cpu": False, "network": False}
    return {"timeout": True, **{k: bool(v) for k, v in found.items()}}
