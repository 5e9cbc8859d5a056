"""Ray orchestration: a cluster (local by default, `RAY_ADDRESS` joins one), one placement group of
one bundle per rank on the device resource, and worker actors whose failures stop the run.

A call on all ranks (`call`) returns when every rank has answered. The first failure ends it: the
other ranks get a few seconds to report theirs (a rank that dies makes its peers' collectives fail
too, and their errors can reach the driver first), the rank whose process died is blamed ahead of
ranks that only raised, its traceback is raised as `WorkerError`, and every actor is killed, so
ranks blocked in a collective with the dead one cannot hang the run. `timeout_s` bounds the call.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

log = structlog.get_logger()

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# After the first failure, how long the other ranks may take to report theirs.
FAILURE_GRACE_S = 3.0


class WorkerError(RuntimeError):
    """A worker raised, died, or did not answer in time; the message carries its traceback."""


def ensure_ray(*, num_cpus: int | None) -> bool:
    """Start a local Ray cluster (or join `RAY_ADDRESS`) unless Ray is already initialised.
    Returns True when this call started it (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        log.info("ray.join", address=address)
        ray.init(address=address, log_to_driver=True)
    else:
        log.info("ray.start_local", num_cpus=num_cpus)
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    return True


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
        remote_cls = ray.remote(worker_cls)
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

    def call(
        self,
        method: str,
        *,
        args_per_rank: Sequence[tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
        timeout_s: float | None = None,
        on_done: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run `method` on every rank (same kwargs, or per-rank (args, kwargs)); results by rank.
        `on_done(rank)` is called as each rank's answer arrives (e.g. to advance a progress bar)."""

        if args_per_rank is not None and len(args_per_rank) != self.world_size:
            raise ValueError(f"args_per_rank has {len(args_per_rank)} entries for {self.world_size} ranks")
        refs = []
        for rank, actor in enumerate(self.actors):
            args, kw = args_per_rank[rank] if args_per_rank is not None else ((), {})
            refs.append(getattr(actor, method).remote(*args, **{**kwargs, **kw}))
        return self.wait(refs, what=method, timeout_s=timeout_s, on_done=on_done)

    def call_rank(
        self, rank: int, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> Any:
        return self.wait(
            [getattr(self.actors[rank], method).remote(*args, **kwargs)],
            what=method,
            timeout_s=timeout_s,
            ranks=[rank],
        )[0]

    def wait(
        self,
        refs: list[Any],
        *,
        what: str,
        timeout_s: float | None,
        ranks: list[int] | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[Any]:
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
                self.kill()
                raise WorkerError(
                    f"{what}: ranks {sorted(rank_of[r] for r in pending)} gave no answer within {timeout_s} s; "
                    "all workers were stopped"
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

    def kill(self) -> None:
        """Kill every actor and release the placement group (idempotent)."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("worker_group.kill_failed", error=repr(exc))
        self.actors = []
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
    return WorkerError(message)
