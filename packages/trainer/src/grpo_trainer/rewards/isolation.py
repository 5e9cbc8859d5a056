"""Running reward calls with a per-call timeout so that a raising or hanging reward cannot stop
the run.

The derivation: docs/INTERNALS.md, `grpo_trainer.rewards.isolation`.
"""

from __future__ import annotations

import os
import pickle
import queue
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_trainer.rewards.protocol import as_score, describe_error, read_message, write_message


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok" | "error" | "timeout"
    score: float = 0.0
    message: str = ""


Call = tuple[Callable[..., Any], tuple[Any, ...]]


def _not_started(timeout_s: float) -> Outcome:
    return Outcome("timeout", message=f"not started within the batch's {timeout_s:g} s")


class ThreadRunner:
    def __init__(self, *, num_workers: int = 1) -> None:
        self.num_workers = max(1, num_workers)
        self.abandoned = 0  # threads still running past their deadline, ever

    def run(self, calls: Sequence[Call], timeout_s: float) -> list[Outcome]:
        """Every call done within `timeout_s` of the start (the batch's budget), else a timeout."""
        outcomes: list[Outcome | None] = [None] * len(calls)
        done: queue.Queue[tuple[int, Outcome]] = queue.Queue()  # one per run: late finishers go nowhere
        pending = deque(range(len(calls)))
        deadlines: dict[int, float] = {}
        batch_deadline = time.monotonic() + timeout_s

        def work(i: int) -> None:
            fn, args = calls[i]
            try:
                done.put((i, Outcome("ok", as_score(fn(*args)))))
            except BaseException as exc:
                done.put((i, Outcome("error", message=describe_error(exc))))

        while pending or deadlines:
            if pending and time.monotonic() >= batch_deadline:
                for i in pending:
                    outcomes[i] = _not_started(timeout_s)
                pending.clear()
            while pending and len(deadlines) < self.num_workers:
                i = pending.popleft()
                deadlines[i] = batch_deadline
                threading.Thread(target=work, args=(i,), daemon=True, name=f"reward-{i}").start()
            if not deadlines:
                continue
            try:
                i, outcome = done.get(timeout=max(0.0, min(deadlines.values()) - time.monotonic()))
                if i in deadlines:
                    del deadlines[i]
                    outcomes[i] = outcome
            except queue.Empty:
                pass
            now = time.monotonic()
            for i in [i for i, deadline in deadlines.items() if deadline <= now]:
                del deadlines[i]
                outcomes[i] = Outcome("timeout", message=f"no result within the batch's {timeout_s:g} s")
                self.abandoned += 1
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        pass


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_trainer.rewards._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env=_child_env(),
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.in_fd = self.proc.stdin.fileno()
        self.out_fd = self.proc.stdout.fileno()
        self.loaded: set[int] = set()

    def send(self, message: Any) -> None:
        write_message(self.in_fd, message)

    def wait_reply(self, timeout_s: float) -> Any:
        """The worker's reply; raises TimeoutError, or EOFError when the worker died."""
        ready, _, _ = select.select([self.out_fd], [], [], max(0.0, timeout_s))
        if not ready:
            raise TimeoutError
        return read_message(self.out_fd)

    def exit_note(self) -> str:
        code = self.proc.poll()
        return "reward worker process died" + ("" if code is None else f" (exit code {code})")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class FunctionLoadError(RuntimeError):
    """A worker process could not start or could not unpickle the reward function."""


class ProcessRunner:
    def __init__(self, *, num_workers: int = 1, load_timeout_s: float = 120.0) -> None:
        self.num_workers = max(1, num_workers)
        self.load_timeout_s = load_timeout_s
        self._idle: list[_Worker] = []
        self._payloads: dict[int, bytes] = {}
        self._keep: dict[int, Callable[..., Any]] = {}  # keeps ids stable while cached

    def function_key(self, fn: Callable[..., Any]) -> int:
        """Pickles `fn` once; raises (pickle errors) when it cannot go to another process."""
        key = id(fn)
        if key not in self._payloads:
            self._payloads[key] = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
            self._keep[key] = fn
        return key

    def _ensure_loaded(self, worker: _Worker, key: int) -> None:
        if key in worker.loaded:
            return
        worker.send(("load", key, self._payloads[key]))
        try:
            status, detail = worker.wait_reply(self.load_timeout_s)
        except (TimeoutError, EOFError, OSError) as exc:
            worker.kill()
            raise FunctionLoadError(
                f"reward worker did not start or load in time: {worker.exit_note()}"
            ) from exc
        if status != "ok":
            raise FunctionLoadError(f"reward worker cannot load the function: {detail}")
        worker.loaded.add(key)

    def _take_worker(self) -> _Worker:
        return self._idle.pop() if self._idle else _Worker()

    def _load_on(self, worker: _Worker, key: int) -> None:
        try:
            self._ensure_loaded(worker, key)
        except FunctionLoadError:
            if worker.proc.poll() is None:
                self._idle.append(worker)
            raise

    def preload(self, fn: Callable[..., Any]) -> int:
        """Checks that `fn` pickles and that a worker can import it; returns its key. Raises a
        pickling error or FunctionLoadError otherwise."""
        key = self.function_key(fn)
        worker = self._take_worker()
        self._load_on(worker, key)
        self._idle.append(worker)
        return key

    def run(self, calls: Sequence[tuple[int, tuple[Any, ...]]], timeout_s: float) -> list[Outcome]:
        """`calls` are (function_key, args), every one done within `timeout_s` of the start (the
        batch's budget: hung calls cost one timeout per batch, not one each), else a timeout.
        Raises FunctionLoadError when a function cannot be loaded by a fresh worker (the caller
        then falls back to threads)."""
        outcomes: list[Outcome | None] = [None] * len(calls)
        pending = deque(range(len(calls)))
        busy: dict[int, tuple[_Worker, int, float]] = {}  # out_fd -> (worker, call index, deadline)
        batch_deadline = time.monotonic() + timeout_s
        try:
            while pending or busy:
                if pending and time.monotonic() >= batch_deadline:
                    for i in pending:
                        outcomes[i] = _not_started(timeout_s)
                    pending.clear()
                while pending and len(busy) < self.num_workers:
                    worker = self._take_worker()
                    i = pending.popleft()
                    key, args = calls[i]
                    self._load_on(worker, key)
                    try:
                        worker.send(("call", key, args))
                    except OSError:
                        worker.kill()
                        outcomes[i] = Outcome("error", message=worker.exit_note())
                        continue
                    busy[worker.out_fd] = (worker, i, batch_deadline)
                if not busy:
                    continue
                wait = max(0.0, min(d for _, _, d in busy.values()) - time.monotonic())
                ready, _, _ = select.select(list(busy), [], [], wait)
                for fd in ready:
                    worker, i, _ = busy.pop(fd)
                    try:
                        status, value = read_message(fd)
                    except (EOFError, OSError):
                        worker.kill()
                        outcomes[i] = Outcome("error", message=worker.exit_note())
                        continue
                    outcomes[i] = Outcome("ok", value) if status == "ok" else Outcome("error", message=value)
                    self._idle.append(worker)
                now = time.monotonic()
                for fd in [fd for fd, (_, _, d) in busy.items() if d <= now]:
                    worker, i, _ = busy.pop(fd)
                    worker.kill()  # the only way to stop a hung call; a fresh worker replaces it
                    outcomes[i] = Outcome(
                        "timeout", message=f"no result within the batch's {timeout_s:g} s (worker killed)"
                    )
        finally:
            for worker, _, _ in busy.values():  # interrupted mid-batch: their replies would be stale
                worker.kill()
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        while self._idle:
            self._idle.pop().kill()
