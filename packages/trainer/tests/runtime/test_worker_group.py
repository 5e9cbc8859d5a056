"""WorkerGroup on a real local Ray cluster with 2 CPU actors: results by rank, and a rank that
raises or dies stops the call at once with its traceback, even while the other rank is blocked
in a gloo collective with it."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

from grpo_trainer.worker_group import WorkerError, WorkerGroup, ensure_ray

pytestmark = pytest.mark.timeout(300)


class Probe:
    def __init__(self, *, rank: int, world_size: int, tag: str) -> None:
        self.rank, self.world_size, self.tag = rank, world_size, tag

    def address(self) -> tuple[str, int]:
        from grpo_trainer.worker import free_port

        return "127.0.0.1", free_port()

    def join(self, addr: str, port: int) -> int:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=600),
        )
        return self.rank

    def echo(self, value: int) -> tuple[int, int, str, int]:
        return self.rank, value, self.tag, os.getpid()

    def all_reduce_unless(self, failing_rank: int, how: str) -> float:
        """Every rank but `failing_rank` enters an all-reduce that can only finish with all ranks."""
        import torch
        import torch.distributed as dist

        if self.rank == failing_rank:
            time.sleep(0.5)  # let the other rank block first
            if how == "exit":
                os._exit(3)
            raise RuntimeError(f"injected failure on rank {self.rank}")
        value = torch.ones(1)
        dist.all_reduce(value)
        return float(value)

    def raise_now_unless_dying(self, dying_rank: int) -> None:
        """What a rank's death looks like when its peers' collectives notice first: the other
        ranks raise at once, the dying rank's process is gone 0.3 s later."""
        if self.rank == dying_rank:
            time.sleep(0.3)
            os._exit(3)
        raise ConnectionError(f"peer closed the connection (seen on rank {self.rank})")


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    started = ensure_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def group(ray_cluster):
    workers = WorkerGroup(Probe, world_size=2, resource=None, cpus_per_worker=1, tag="t")
    addr, port = workers.call_rank(0, "address", timeout_s=120)
    assert workers.call("join", args_per_rank=[((addr, port), {}), ((addr, port), {})], timeout_s=120) == [
        0,
        1,
    ]
    yield workers
    workers.kill()


def test_results_come_back_by_rank_from_two_processes(group) -> None:
    out = group.call("echo", args_per_rank=[((10,), {}), ((11,), {})], timeout_s=60)
    assert [(r, v, t) for r, v, t, _ in out] == [(0, 10, "t"), (1, 11, "t")]
    assert out[0][3] != out[1][3]
    seen: list[int] = []
    group.call("echo", value=5, timeout_s=60, on_done=seen.append)
    assert sorted(seen) == [0, 1]
    with pytest.raises(ValueError, match="2 ranks"):
        group.call("echo", args_per_rank=[((1,), {})])


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failing_rank_stops_the_run_while_its_peer_waits_in_a_collective(group, how) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.call("all_reduce_unless", failing_rank=1, how=how, timeout_s=120)
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"took {elapsed:.0f} s: the blocked rank held the run"
    message = str(info.value)
    assert "rank 1" in message and "all workers were stopped" in message
    if how == "raise":
        # The worker's own traceback: the raising line and the exception.
        assert 'raise RuntimeError(f"injected failure' in message
        assert "RuntimeError: injected failure on rank 1" in message
        assert "\x1b[" not in message  # terminal colour codes stripped
    assert group.actors == []  # everything was killed


def test_the_rank_that_died_is_blamed_even_when_a_peer_errors_first(group) -> None:
    with pytest.raises(WorkerError) as info:
        group.call("raise_now_unless_dying", dying_rank=1, timeout_s=120)
    message = str(info.value)
    assert message.startswith("raise_now_unless_dying failed on rank 1; all workers were stopped")
    assert "also failed, likely because of it: rank 0: " in message
    assert "peer closed the connection (seen on rank 0)" in message.split("also failed")[1]
    assert group.actors == []


def test_a_call_past_its_timeout_is_an_error_not_a_hang(group) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"ranks \[0\] gave no answer within 2"):
        # Only rank 0 enters the all-reduce, so it can never finish.
        group.call_rank(0, "all_reduce_unless", failing_rank=1, how="raise", timeout_s=2)
    assert time.monotonic() - started < 60
    assert group.actors == []


def test_an_unplaceable_group_fails_with_the_fix(ray_cluster) -> None:
    with pytest.raises(WorkerError, match="could not reserve"):
        WorkerGroup(Probe, world_size=3, resource=None, cpus_per_worker=1, ready_timeout_s=3, tag="x")
