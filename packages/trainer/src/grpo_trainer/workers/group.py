"""Ray orchestration: a cluster (local by default, `RAY_ADDRESS` joins one), one placement group of
one bundle per rank on the device resource, and worker actors whose failures stop the run.

The derivation: docs/INTERNALS.md, `grpo_trainer.workers.group`.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import glob
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from grpo_trainer.workers.reaper import start_reaper

log = structlog.get_logger()

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# After the first failure, how long the other ranks may take to report theirs.
FAILURE_GRACE_S = 3.0
# After a timeout, how long collecting the silent ranks' stacks may take in all.
STACK_DUMP_TIMEOUT_S = 10.0
# How long a rank's process may take to write its stack once signalled.
_STACK_WRITE_S = 2.0
_STACK_SIGNAL = signal.SIGUSR1
_STACK_FILE_PREFIX = "grpo-worker-stack-"
# In a worker process: the open file faulthandler writes to (kept open) and its path.
_stack_file: Any = None
_stack_path: str | None = None


_reaper: Any = None  # the watcher of a local cluster's processes (reaper.py)


class WorkerError(RuntimeError):
    """A worker raised, died, or did not answer in time; the message carries its traceback.
    `rank` and `phase` say where; `cause` is the worker's own exception when it raised one (None
    when it died or timed out), `died` whether its process ended, `summary` the last line of the
    worker's error."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        phase: str | None = None,
        cause: BaseException | None = None,
        died: bool = False,
        summary: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.phase = phase
        self.cause = cause
        self.died = died
        self.summary = summary


class WorkerTimeoutError(WorkerError):
    """Ranks gave no answer within a call's timeout; the message carries their Python stacks."""


def ensure_ray(*, num_cpus: int | None, runtime_env: dict[str, Any] | None = None) -> bool:
    """Start a local Ray cluster (or join `RAY_ADDRESS`) unless Ray is already initialised, with
    `runtime_env` for the job's workers. Returns True when this call started it (the caller then
    shuts it down)."""
    import ray

    if ray.is_initialized():
        if runtime_env:
            log.warning("ray.runtime_env_not_applied", reason="Ray was initialised before train()")
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        log.info("ray.join", address=address)
        ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
    else:
        global _reaper
        log.info("ray.start_local", num_cpus=num_cpus)
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, runtime_env=runtime_env)
        _reaper = start_reaper()  # ends the cluster's processes if this driver is killed
    return True


def shutdown_ray() -> None:
    """Shut down the Ray cluster `ensure_ray` started (and its reaper: nothing is left to end)."""
    import ray

    global _reaper
    ray.shutdown()
    if _reaper is not None:
        _reaper.kill()
        _reaper.wait()
        _reaper = None


class WorkerGroup:
    """`world_size` actors of `worker_cls`, rank i in bundle i of one placement group.

    `resource` is the device resource ("GPU", "NPU") or None for CPU-only workers, each of which
    then reserves `cpus_per_worker` CPUs. Constructor kwargs get `rank` and `world_size` added."""

    def __init__(
        self,
        worker_cls: type,
        *,
        world_size: int,
        resource: str | None,
        cpus_per_worker: int = 1,
        ready_timeout_s: float = 600.0,
        **worker_kwargs: Any,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world_size = world_size
        bundle: dict[str, float] = {"CPU": cpus_per_worker}
        if resource is not None:
            bundle[resource] = 1
        self.placement_group = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        try:
            ray.get(self.placement_group.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            ray.util.remove_placement_group(self.placement_group)
            raise WorkerError(
                f"Ray could not reserve {world_size} x {bundle} within {ready_timeout_s:.0f} s "
                f"(cluster has {ray.cluster_resources()}); lower device.devices_per_node / nnodes or add nodes"
            ) from exc
        remote_cls = ray.remote(_with_stack_dumps(worker_cls))
        self.actors = []
        for rank in range(world_size):
            options: dict[str, Any] = {
                "num_cpus": cpus_per_worker,
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=self.placement_group, placement_group_bundle_index=rank
                ),
            }
            if resource == "GPU":
                options["num_gpus"] = 1
            elif resource is not None:
                options["resources"] = {resource: 1}
            self.actors.append(
                remote_cls.options(**options).remote(rank=rank, world_size=world_size, **worker_kwargs)
            )
        # Asked first, so answered before any user method runs: known even when `setup` hangs.
        self._info_refs = [actor._grpo_process_info.remote() for actor in self.actors]
        self._process_info: dict[int, tuple[int, str, str | None]] = {}

    def call(
        self,
        method: str,
        *,
        args_per_rank: Sequence[tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
        timeout_s: float | None = None,
        timeout_setting: str | None = None,
        on_done: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run `method` on every rank (same kwargs, or per-rank (args, kwargs)); results by rank.
        `on_done(rank)` is called as each rank's answer arrives (e.g. to advance a progress bar).
        `timeout_setting` is the config key behind `timeout_s` ("timeouts.update_s"), quoted when
        the call times out."""

        refs = self.submit(method, args_per_rank=args_per_rank, **kwargs)
        return self.wait(
            refs, what=method, timeout_s=timeout_s, timeout_setting=timeout_setting, on_done=on_done
        )

    def submit(
        self,
        method: str,
        *,
        args_per_rank: Sequence[tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Start `method` on every rank and return at once: one Ray reference per rank, for `wait`
        (which applies the failure and timeout handling of `call`)."""
        if args_per_rank is not None and len(args_per_rank) != self.world_size:
            raise ValueError(f"args_per_rank has {len(args_per_rank)} entries for {self.world_size} ranks")
        refs = []
        for rank, actor in enumerate(self.actors):
            args, kw = args_per_rank[rank] if args_per_rank is not None else ((), {})
            refs.append(getattr(actor, method).remote(*args, **{**kwargs, **kw}))
        return refs

    def call_rank(
        self,
        rank: int,
        method: str,
        *args: Any,
        timeout_s: float | None = None,
        timeout_setting: str | None = None,
        **kwargs: Any,
    ) -> Any:
        return self.wait(
            [getattr(self.actors[rank], method).remote(*args, **kwargs)],
            what=method,
            timeout_s=timeout_s,
            timeout_setting=timeout_setting,
            ranks=[rank],
        )[0]

    def wait(
        self,
        refs: list[Any],
        *,
        what: str,
        timeout_s: float | None,
        timeout_setting: str | None = None,
        ranks: list[int] | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """Results of `refs` (one per rank of `ranks`, default 0..n-1) in that order; a failure or
        a timeout kills every actor and raises (`WorkerError`, `WorkerTimeoutError`)."""
        import ray

        ranks = ranks if ranks is not None else list(range(len(refs)))
        rank_of = {ref: rank for ref, rank in zip(refs, ranks, strict=True)}
        results: dict[int, Any] = {}
        pending = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            if not ready:
                silent = sorted(rank_of[r] for r in pending)
                stacks = self._stacks(silent)
                self.kill()
                raise _timeout_error(
                    what,
                    silent=silent,
                    answered=sorted(results),
                    timeout_s=timeout_s,
                    timeout_setting=timeout_setting,
                    stacks=stacks,
                )
            ref = ready[0]
            try:
                results[rank_of[ref]] = ray.get(ref)
            except Exception as exc:  # RayTaskError (raised) or RayActorError (died)
                failures = {rank_of[ref]: exc, **self._failures_within_grace(pending, rank_of)}
                self.kill()
                raise _worker_error(what, failures) from failures[_blamed_rank(failures)]
            if on_done is not None:
                on_done(rank_of[ref])
        return [results[rank] for rank in ranks]

    @staticmethod
    def _failures_within_grace(pending: list[Any], rank_of: dict[Any, int]) -> dict[int, Exception]:
        import ray

        failures: dict[int, Exception] = {}
        if not pending:
            return failures
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as exc:
                failures[rank_of[ref]] = exc
        return failures

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        """Per rank: a header (pid, node) and the Python stack of every thread of its process, or
        why it is unavailable. Bounded by STACK_DUMP_TIMEOUT_S in all, whatever the nodes do."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        deadline = time.monotonic() + STACK_DUMP_TIMEOUT_S
        out: dict[int, str] = {}
        dumps: dict[Any, int] = {}
        for rank, info in self._fetch_process_info(ranks).items():
            if isinstance(info, str):
                out[rank] = f"stack unavailable: {info}"
                continue
            pid, node_id, path = info
            out[rank] = f"pid {pid}, node {node_id}"
            if path is None:
                out[rank] += ":\nstack unavailable: its process could not set up stack dumps (see its log)"
                continue
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            ref = _dump_stack_task().options(scheduling_strategy=strategy).remote(pid, path, _STACK_WRITE_S)
            dumps[ref] = rank
        if dumps:
            remaining = max(0.0, deadline - time.monotonic())
            done, late = ray.wait(list(dumps), num_returns=len(dumps), timeout=remaining)
            for ref in done:
                try:
                    text = ray.get(ref)
                except Exception as exc:
                    lines = _plain_text(exc).strip().splitlines()
                    text = f"stack unavailable: {lines[-1] if lines else type(exc).__name__}"
                out[dumps[ref]] += ":\n" + text.rstrip()
            for ref in late:
                out[dumps[ref]] += (
                    f":\nstack unavailable: its node did not answer within {STACK_DUMP_TIMEOUT_S:g} s"
                )
                try:
                    ray.cancel(ref, force=True)
                except Exception as exc:  # finished meanwhile, or its node is gone
                    log.debug("worker_group.cancel_stack_dump_failed", error=repr(exc))
        return out

    def _fetch_process_info(self, ranks: list[int]) -> dict[int, tuple[int, str, str | None] | str]:
        """Per rank: (pid, node id, stack file or None) of its process, or why it is not known. The answers
        were asked for at creation; those not in yet get one short wait, shared by all ranks."""
        import ray

        out: dict[int, tuple[int, str, str | None] | str] = {}
        asked = {
            self._info_refs[r]: r for r in ranks if r not in self._process_info and r < len(self._info_refs)
        }
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=1.0) if asked else ([], [])
        for ref in ready:
            try:
                self._process_info[asked[ref]] = ray.get(ref)
            except Exception as exc:
                out[asked[ref]] = f"its process could not report its pid ({type(exc).__name__})"
        for rank in ranks:
            if rank in self._process_info:
                out[rank] = self._process_info[rank]
            elif rank >= len(self._info_refs):
                out[rank] = "the group's actors were already stopped"
            else:
                out.setdefault(rank, "its process never reported its pid (it may still be starting)")
        return out

    def shutdown(self, *, timeout_s: float) -> None:
        """Ask every actor to `shutdown()` (engines release shared and device memory), then kill
        them all; an actor that cannot answer is killed anyway (idempotent)."""
        if self.actors:
            try:
                self.call("shutdown", timeout_s=timeout_s, timeout_setting=None)
            except Exception as exc:  # a failed rank: the group is already stopped
                log.warning("worker_group.shutdown_failed", error=str(exc).splitlines()[0])
        self.kill()

    def kill(self) -> None:
        """Kill every actor and release the placement group (idempotent)."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("worker_group.kill_failed", error=repr(exc))
        self.actors = []
        self._info_refs = []
        try:
            ray.util.remove_placement_group(self.placement_group)
        except Exception as exc:
            log.debug("worker_group.remove_pg_failed", error=repr(exc))


def _blamed_rank(failures: dict[int, Exception]) -> int:
    """The first rank (in arrival order) whose process died, else the first that raised."""
    from ray.exceptions import RayActorError

    died = [rank for rank, exc in failures.items() if isinstance(exc, RayActorError)]
    return died[0] if died else next(iter(failures))


def _plain_text(exc: Exception) -> str:
    return _ANSI_ESCAPE.sub("", str(exc))


def _worker_error(what: str, failures: dict[int, Exception]) -> WorkerError:
    blamed = _blamed_rank(failures)
    message = f"{what} failed on rank {blamed}; all workers were stopped:\n{_plain_text(failures[blamed])}"
    others = []
    for rank, exc in failures.items():
        if rank != blamed:
            lines = _plain_text(exc).strip().splitlines()
            others.append(f"rank {rank}: {lines[-1] if lines else type(exc).__name__}")
    if others:
        message += "\nalso failed, likely because of it: " + "; ".join(others)
    exc = failures[blamed]
    lines = _plain_text(exc).strip().splitlines()
    return WorkerError(
        message,
        rank=blamed,
        phase=what,
        cause=_worker_exception(exc),
        died=_process_died(exc),
        summary=lines[-1] if lines else type(exc).__name__,
    )


def _process_died(exc: Exception) -> bool:
    from ray.exceptions import RayActorError

    return isinstance(exc, RayActorError)


def _worker_exception(exc: Exception) -> BaseException | None:
    """The exception the worker's own code raised (Ray wraps it), None when its process died."""
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        return cause if isinstance(cause, BaseException) and not isinstance(cause, RayTaskError) else None
    return None


def _timeout_error(
    what: str,
    *,
    silent: list[int],
    answered: list[int],
    timeout_s: float | None,
    timeout_setting: str | None,
    stacks: dict[int, str],
) -> WorkerTimeoutError:
    limit = (
        f"raise {timeout_setting} if this phase is only slow"
        if timeout_setting
        else "raise the call's timeout_s if this phase is only slow"
    )
    message = (
        f"{what}: ranks {silent} gave no answer within {timeout_s:g} s ({limit}); "
        f"ranks {answered} answered; all workers were stopped. "
        "Python stacks of the ranks that gave no answer (all threads, most recent call first):"
    )
    for rank in silent:
        message += f"\n--- rank {rank}, {stacks[rank]}"
    return WorkerTimeoutError(message, phase=what, rank=silent[0] if silent else None)


# -- stack dumps: the worker side (in each actor's process) and the node-side task -----------------


def _with_stack_dumps(worker_cls: type) -> type:
    """A subclass of `worker_cls` (same name, same constructor signature) that registers the stack
    dump before the user's constructor runs and answers `_grpo_process_info()`."""
    base_init = worker_cls.__init__

    @functools.wraps(base_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _register_stack_dump()
        base_init(self, *args, **kwargs)

    def _grpo_process_info(self: Any) -> tuple[int, str, str | None]:
        return _process_info()

    return type(
        worker_cls.__name__,
        (worker_cls,),
        {
            "__init__": __init__,
            "_grpo_process_info": _grpo_process_info,
            "__doc__": worker_cls.__doc__,
            "__module__": worker_cls.__module__,
        },
    )


def _register_stack_dump() -> None:
    """In a worker process: on SIGUSR1, write every thread's Python stack to a file of its own (a
    fresh private temp file). Never fails the worker: without it, a timeout only lacks the stack."""
    global _stack_file, _stack_path
    if _stack_file is not None:
        return
    _remove_stale_stack_files()
    try:
        fd, path = tempfile.mkstemp(prefix=f"{_STACK_FILE_PREFIX}{os.getpid()}-", suffix=".txt")
        stack_file = os.fdopen(fd, "w")
        faulthandler.register(_STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    except Exception as exc:
        log.warning("worker_group.stack_dump_unavailable", error=repr(exc))
        return
    _stack_file, _stack_path = stack_file, path
    atexit.register(_remove_quietly, path)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _remove_stale_stack_files() -> None:
    """Killed workers cannot remove their stack files: the next worker on the node removes those
    whose process is gone."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{_STACK_FILE_PREFIX}*.txt")):
        pid = os.path.basename(path)[len(_STACK_FILE_PREFIX) :].split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _remove_quietly(path)
        except (ValueError, OSError):  # not ours, or another user's process
            continue


def _process_info() -> tuple[int, str, str | None]:
    """In a worker process: (pid, node id, stack file or None). A module function, not a closure,
    so it reads this module's `_stack_path` (a closure sent by value would carry a copy of None)."""
    import ray

    return os.getpid(), ray.get_runtime_context().get_node_id(), _stack_path


def _dump_stack(pid: int, path: str, write_s: float) -> str:
    """On the worker's node: signal `pid` and return what it appended to its stack file."""
    try:
        start = os.path.getsize(path)
    except OSError as exc:
        return f"stack unavailable: no stack file on its node ({exc})"
    try:
        os.kill(pid, _STACK_SIGNAL)
    except OSError as exc:
        return f"stack unavailable: could not signal pid {pid} ({exc})"
    deadline = time.monotonic() + write_s
    last = start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        size = os.path.getsize(path)
        if size > start and size == last:  # written and no longer growing
            break
        last = size
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", errors="replace")
    _remove_quietly(path)  # the worker is killed next
    return text or f"stack unavailable: pid {pid} wrote nothing within {write_s:g} s of SIGUSR1"


@functools.cache
def _dump_stack_task() -> Any:
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(_dump_stack)
