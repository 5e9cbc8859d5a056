"""Model-parallel shards as plain tensors under keys of each rank's own (the Megatron backend's
checkpoint): two gloo processes save different entries; the checkpoint holds both ranks' tensors
and its structure names both, so each rank finds its own shard again (before, rank 0's structure
alone was written and DCP kept one copy of a key both ranks used: every rank resumed rank 0's shard)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_ckpt import CheckpointManager
from grpo_ckpt.structure import merge_skeletons


def _shard(rank: int) -> torch.Tensor:
    return torch.full((3, 2), float(rank + 1))


def _worker(rank: int, root: str, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = {f"tp{rank}": {"w": _shard(rank)}, "shared": torch.arange(4.0)}
        CheckpointManager(root).save(1, model=model, optimizer=None, scheduler=None, trainer_state={"global_step": 1})
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_each_rank_own_keys_are_all_saved(tmp_path: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(
        _worker, args=(str(tmp_path / "ckpt"), str(tmp_path / "pg_init")), nprocs=2, join=True,
        start_method="spawn" if dist.is_initialized() else "fork",
    )
    loaded = CheckpointManager(tmp_path / "ckpt").load(tmp_path / "ckpt" / "global_step_1")
    assert sorted(loaded.model) == ["shared", "tp0", "tp1"]
    for rank in (0, 1):
        assert torch.equal(loaded.model[f"tp{rank}"]["w"], _shard(rank))
    assert torch.equal(loaded.model["shared"], torch.arange(4.0))


def test_merge_keeps_entries_of_either_and_refuses_disagreement() -> None:
    a = {"__dict__": [["x", {"__tensor__": "x"}], [0, 1]]}
    b = {"__dict__": [["y", {"__tensor__": "y"}], [0, 1], ["0", 2]]}
    assert merge_skeletons([a, b]) == {"__dict__": [["x", {"__tensor__": "x"}], [0, 1], ["y", {"__tensor__": "y"}], ["0", 2]]}
    with pytest.raises(ValueError, match="different structures at"):
        merge_skeletons([a, {"__dict__": [[0, 5]]}])
