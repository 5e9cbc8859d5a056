"""How a launch that failed ends: one line on stderr (what, where, what to do) and an exit status;
the traceback goes to the run's log (`run_log.py`). Exit 2: something the user or the machine must
change (a setting, a file, disk space, a worker killed for memory); 130: interrupted; 1: a bug in
grpo (the line says so and where the traceback is).

A failure in a worker arrives as `WorkerError` carrying the worker's own exception; it is judged by
that exception, with the rank and the phase added."""

from __future__ import annotations

import errno
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_USAGE = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Failure:
    exit_code: int
    line: str


def one_line(text: str) -> str:
    """A message on one line: its lines joined, indentation dropped."""
    return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def describe(exc: BaseException, *, checkpoint_dir: str | None, log_path: Path | None) -> Failure:
    """The exit status and the line for `exc` raised by a launch."""
    see = f" (traceback: {log_path})" if log_path else ""
    if isinstance(exc, KeyboardInterrupt):
        return Failure(
            EXIT_INTERRUPTED,
            f"interrupted. {_last_good(checkpoint_dir)} Run the same command again to resume from it{see}.",
        )
    if _is_timeout(exc):
        first = str(exc).strip().splitlines()[0]
        return Failure(
            EXIT_USAGE,
            f"{first.removesuffix(' Python stacks of the ranks that gave no answer (all threads, most recent call first):')} Their Python stacks are in the log{see}.",
        )
    cause, where = _cause(exc)
    full = _disk_full(cause)
    if full is not None:
        return Failure(
            EXIT_USAGE,
            f"{full}{where}. {_last_good(checkpoint_dir)} Free space, then run the "
            f"same command again to resume{see}.",
        )
    if isinstance(cause, ValueError):
        return Failure(EXIT_USAGE, f"{one_line(str(cause))}{where}{see}")
    died = _died(exc, checkpoint_dir)
    if died is not None:
        return Failure(EXIT_USAGE, f"{died}{see}")
    name = type(cause).__name__
    message = one_line(str(cause)) or name
    return Failure(
        EXIT_BUG,
        f"internal error {name}: {message}{where}. This is a bug in grpo: please report it "
        f"with the traceback{see}.",
    )


def _cause(exc: BaseException) -> tuple[BaseException, str]:
    """The exception to judge (a worker's own, when a worker raised) and where it happened."""
    worker = _worker_error(exc)
    if worker is None or worker.cause is None:
        return exc, ""
    return worker.cause, f" (rank {worker.rank}, {worker.phase})"


def _worker_error(exc: BaseException) -> Any:
    from grpo_trainer.workers.group import WorkerError

    return exc if isinstance(exc, WorkerError) else None


def _is_timeout(exc: BaseException) -> bool:
    from grpo_trainer.workers.group import WorkerTimeoutError

    return isinstance(exc, WorkerTimeoutError)


def _died(exc: BaseException, checkpoint_dir: str | None) -> str | None:
    worker = _worker_error(exc)
    if worker is None or not worker.died:
        return None
    kind = re.search(r"Worker exit type: (\w+)", worker.summary)
    how = f"Ray's exit type {kind.group(1)}" if kind else one_line(worker.summary)[:200]
    return (
        f"rank {worker.rank}'s process died during {worker.phase} ({how}): a process killed by the system "
        f"is most often out of memory (host or device); the worker's own lines are in the log. "
        f"{_last_good(checkpoint_dir)} Run the same command again to resume from it"
    )


_NO_SPACE = re.compile(r"\[Errno 28\] No space left on device(?:: '([^']+)')?")


def _disk_full(exc: BaseException) -> str | None:
    """The full-disk line when `exc` (or what it wraps, as text where a library re-raised it:
    torch's distributed checkpoint, a worker's traceback) is ENOSPC."""
    chain: BaseException | None = exc
    while chain is not None:
        path = None
        if isinstance(chain, OSError) and chain.errno == errno.ENOSPC:
            path = chain.filename or ""
        else:
            found = _NO_SPACE.search(str(chain))
            path = (found.group(1) or "") if found else None
        if path is not None:
            if not path:
                return "disk full (no space left on device)"
            free = _free_bytes(Path(path))
            return f"disk full writing {path}" + (f" ({_gib(free)} free there)" if free is not None else "")
        chain = chain.__cause__ or chain.__context__
    return None


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _last_good(checkpoint_dir: str | None) -> str:
    if not checkpoint_dir:
        return "No checkpoint was written."
    from grpo_ckpt import CheckpointManager

    try:
        latest = CheckpointManager(checkpoint_dir).latest_complete()
    except (OSError, ValueError):
        latest = None
    if latest is None:
        return f"No complete checkpoint in {checkpoint_dir} yet (the run starts over)."
    return f"The last complete checkpoint is {latest}."
