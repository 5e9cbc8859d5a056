"""Test support: the ranks of a layout run as forks of one process that imported the Megatron
stack once, for world sizes whose separate processes would not fit this machine's memory (32 and 64
ranks: ~0.9 GB each when every rank imports torch, megatron-core, Megatron-Bridge and transformers
itself; forked, the imported code and data are shared until written).

`python forked_ranks.py spec.json world_size` imports what `layout_rank.main` imports, freezes the
garbage collector's view of those objects (so that collections do not touch, and un-share, their
pages), then forks one child per rank with the variables `cpu_ranks.init_rank` reads and its output
in `out/rank{R}.log`. Each child runs `layout_rank.main` as a process of `cpu_ranks.run_ranks`
would. The parent exits non-zero when any child does, and writes `out/memory.json` (the peak
proportional set size of all ranks together, from /proc/<pid>/smaps_rollup, sampled each second).
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


def main(spec_path: str, world_size: int) -> int:
    import layout_rank
    import torch
    import transformers  # noqa: F401

    from grpo_ckpt import import_megatron_bridge
    from grpo_trainer.backends.megatron.imports import import_megatron_stack

    import_megatron_stack("cpu")
    import_megatron_bridge()

    torch.set_num_threads(1)
    out = Path(json.loads(Path(spec_path).read_text())["out"])
    gc.collect()
    gc.freeze()
    children = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
