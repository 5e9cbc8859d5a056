"""WorkerGroup on a real local Ray cluster with 2 CPU actors: results by rank, and a rank that
raises or dies stops the call at once with its traceback, even while the other rank is blocked
in a gloo collective with it. A rank that gives no answer in time is named with its Python stack,
whether it sleeps, blocks in a collective, spins holding the GIL or hangs in the first call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest

from grpo_trainer.workers.group import WorkerError, WorkerGroup, WorkerTimeoutError

pytestmark = pytest.mark.timeout(300)


class Probe:
    def __init__(self, *, rank: int, world_size: int, tag: str) -> None:
        self.rank, self.world_size, self.tag = rank, world_size, tag

    def address(self) -> tuple[str, int]:
        from grpo_trainer.workers.policy_worker import free_port

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


def _stuck_in_allreduce() -> None:
    time.sleep(3600)


def _spinning_with_the_gil() -> None:
    count = 0
    while True:  # pure Python: the thread holds the GIL but for the interpreter's switches
        count += 1


def _stuck_in_c_holding_the_gil() -> None:
    # Catastrophic backtracking: hours inside the C regex engine, which never releases the GIL.
    re.match(r"(a+)+$", "a" * 64 + "b")


def _stuck_in_setup() -> None:
    time.sleep(3600)


class Hanger:
    """Rank 0 answers at once; rank 1 never does, in a recognisably named function."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank

    def setup(self) -> int:
        if self.rank == 1:
            _stuck_in_setup()
        return self.rank

    def update(self, how: str) -> int:
        if self.rank == 1:
            {"spin": _spinning_with_the_gil, "c": _stuck_in_c_holding_the_gil}.get(how, _stuck_in_allreduce)()
        return self.rank


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
    with pytest.raises(WorkerTimeoutError, match=r"ranks \[0\] gave no answer within 2 s") as info:
        # Only rank 0 enters the all-reduce, so it can never finish.
        group.call_rank(0, "all_reduce_unless", failing_rank=1, how="raise", timeout_s=2)
    assert time.monotonic() - started < 60
    message = str(info.value)
    assert "raise the call's timeout_s" in message and "ranks [] answered" in message
    # Rank 0 is blocked inside gloo's C++ all-reduce; its Python stack still shows where.
    assert "--- rank 0, pid " in message
    assert "in all_reduce_unless" in message.split("--- rank 0")[1]
    assert group.actors == []


def _started_hangers() -> WorkerGroup:
    """Two Hanger ranks whose processes are up (each answered the group's own process-info
    question, which runs before any user method), so a 3 s call measures the call, not start-up."""
    import ray

    workers = WorkerGroup(Hanger, world_size=2, resource=None, cpus_per_worker=1)
    ray.get(workers._info_refs, timeout=120)
    return workers


def _pids(message: str) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r"--- rank (\d+), pid (\d+), node ", message)}


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_a_timeout_names_the_silent_rank_with_its_stack_and_the_setting(ray_cluster) -> None:
    # A killed worker's stack file, left behind: the next worker on the node removes it.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(tempfile.gettempdir()) / f"grpo-worker-stack-{dead.pid}-test.txt"
    stale.write_text("")
    workers = _started_hangers()
    assert not stale.exists()
    started = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        workers.call("update", how="sleep", timeout_s=3, timeout_setting="timeouts.update_s")
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert elapsed < 30, f"took {elapsed:.0f} s"
    assert isinstance(info.value, WorkerError)
    assert message.startswith(
        "update: ranks [1] gave no answer within 3 s (raise timeouts.update_s if this phase is only "
        "slow); ranks [0] answered; all workers were stopped."
    )
    stack = message.split("--- rank 1, ")[1]
    assert "stack unavailable" not in stack
    assert re.search(r'File ".*test_worker_group\.py", line \d+ in _stuck_in_allreduce', stack)
    assert "in update" in stack
    assert "--- rank 0" not in message  # only the silent ranks' stacks
    assert workers.actors == []
    pids = _pids(message)
    assert set(pids) == {1} and pids[1] != os.getpid()
    assert _gone(pids[1]), "the silent rank's process was left running"


def test_an_unplaceable_group_fails_with_the_fix(ray_cluster) -> None:
    with pytest.raises(WorkerError, match="could not reserve"):
        WorkerGroup(Probe, world_size=3, resource=None, cpus_per_worker=1, ready_timeout_s=3, tag="x")


@pytest.mark.parametrize(
    ("how", "function"), [("spin", "_spinning_with_the_gil"), ("c", "_stuck_in_c_holding_the_gil")]
)
def test_a_rank_holding_the_gil_still_yields_its_stack(ray_cluster, how, function) -> None:
    workers = _started_hangers()
    with pytest.raises(WorkerTimeoutError) as info:
        workers.call("update", how=how, timeout_s=3, timeout_setting="timeouts.update_s")
    message = str(info.value)
    assert "ranks [1] gave no answer within 3 s" in message
    assert re.search(rf"line \d+ in {function}\n.*line \d+ in update", message.split("--- rank 1, ")[1])
    assert workers.actors == []
    assert _gone(_pids(message)[1])


def test_a_hang_in_the_first_call_is_reported_with_its_stack(ray_cluster) -> None:
    # No call before `setup`: the process info asked for at creation is what makes the stack known.
    workers = _started_hangers()
    with pytest.raises(WorkerTimeoutError) as info:
        workers.call("setup", timeout_s=3, timeout_setting="timeouts.setup_s")
    message = str(info.value)
    assert message.startswith("setup: ranks [1] gave no answer within 3 s (raise timeouts.setup_s")
    assert "ranks [0] answered" in message
    stack = message.split("--- rank 1, ")[1]
    assert re.search(r"line \d+ in _stuck_in_setup", stack) and "in setup" in stack
    assert workers.actors == []


def test_stack_collection_is_bounded_when_a_node_does_not_answer(ray_cluster, monkeypatch) -> None:
    from grpo_trainer.workers import group as worker_group

    monkeypatch.setattr(worker_group, "STACK_DUMP_TIMEOUT_S", 0.0)  # no node can answer in time
    workers = _started_hangers()
    started = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        workers.call("update", how="sleep", timeout_s=2, timeout_setting="timeouts.update_s")
    assert time.monotonic() - started < 20
    rank1 = str(info.value).split("--- rank 1, ")[1]
    assert re.fullmatch(r"pid \d+, node \w+:\nstack unavailable: its node did not answer within 0 s", rank1)
    assert workers.actors == []
