"""Test support: the ranks of a layout run as forks of one process that imported the Megatron
stack once (~24 CPU-seconds and ~0.9 GB per process that imports torch, megatron-core,
Megatron-Bridge and transformers itself; forked, the imported code and data are shared until
written, which is what lets 32 or 64 ranks fit this machine's memory).

`python forked_ranks.py` imports that stack once, freezes the garbage collector's view of
it (so that collections do not touch, and un-share, its pages) and then runs one layout per request
line on stdin (`{"spec": ..., "world_size": ..., "env": {...}, "log": ...}`). Per run it forks a
leader, a session of its own so that one kill reaches its ranks, which takes the run's environment
and forks one child per rank with the variables `cpu_ranks.init_rank` reads and its output in
`out/rank{R}.log`; each child runs `layout_rank.main` as a process of its own would. The server
answers `started <leader pid>`, then `exit <code>` (non-zero when any rank failed); the leader writes
`out/memory.json` (the peak proportional set size of all ranks together, from
/proc/<pid>/smaps_rollup, sampled each second). The server runs no rank code itself, so every run
starts from the same freshly imported state.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _import_stack() -> None:
    import layout_rank  # noqa: F401
    import torch
    import transformers  # noqa: F401

    from grpo_ckpt import import_megatron_bridge
    from grpo_trainer.backends.megatron.imports import import_megatron_stack

    import_megatron_stack("cpu")
    import_megatron_bridge()
    torch.set_num_threads(1)


def _fork_ranks(spec_path: str, world_size: int) -> int:
    import layout_rank
    import torch

    out = Path(json.loads(Path(spec_path).read_text())["out"])
    children = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            # torch's thread pool, inherited from the parent, is rebuilt on its first use in a fork;
            # rebuilt here, by the only thread, not raced by autograd's threads ("Invalid thread pool!").
            torch.set_num_threads(1)
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0")
            log = os.open(out / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = 0
            try:
                layout_rank.main(spec_path)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        children[pid] = rank
    failed, peak_kib = [], 0
    while children:
        peak_kib = max(peak_kib, sum(_pss_kib(pid) for pid in children) + _pss_kib(os.getpid()))
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                if os.waitstatus_to_exitcode(status) != 0:
                    failed.append(children[pid])
                del children[pid]
        time.sleep(1.0)
    (out / "memory.json").write_text(json.dumps({"peak_pss_gib": round(peak_kib / 2**20, 2), "ranks": world_size}))
    if failed:
        print(f"ranks {sorted(failed)} failed", file=sys.stderr)
        return 1
    return 0


def _lead(request: dict) -> None:
    """One run: its environment and log, then its ranks; never returns."""
    os.setsid()
    os.environ.clear()
    os.environ.update(request["env"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 1
    try:
        code = _fork_ranks(request["spec"], int(request["world_size"]))
    except BaseException:
        import traceback

        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> int:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the imports print goes to the log, not into the answers
    _import_stack()
    gc.collect()
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _lead(request)
        print(f"started {pid}", file=answers, flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", file=answers, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
