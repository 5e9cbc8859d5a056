"""Sharded save at world size 2 (two real processes, gloo, DTensors), loads at world size 1 and 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from grpo_ckpt import CheckpointManager


def _full_state() -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w_rows": torch.randn(5, 4, generator=gen),  # 5 rows over 2 ranks: uneven shards
            "w_cols": torch.randn(3, 6, generator=gen).to(torch.bfloat16),
            "bias": torch.randn(4, generator=gen),
        },
        "optimizer": {"state": {0: {"exp_avg": torch.randn(5, 4, generator=gen), "step": torch.tensor(3.0)}}},
    }


def _shard(full: dict, mesh: object) -> dict:
    model = full["model"]
    return {
        "model": {
            "w_rows": distribute_tensor(model["w_rows"], mesh, [Shard(0)]),
            "w_cols": distribute_tensor(model["w_cols"], mesh, [Shard(1)]),
            "bias": distribute_tensor(model["bias"], mesh, [Replicate()]),
        },
        "optimizer": {"state": {0: {
            "exp_avg": distribute_tensor(full["optimizer"]["state"][0]["exp_avg"], mesh, [Shard(0)]),
            "step": full["optimizer"]["state"][0]["step"].clone(),  # plain tensor: replicated
        }}},
    }


def _worker(rank: int, root: str, init_file: str) -> None:
    torch.set_num_threads(1)  # forked: keep OpenMP out of the child
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        full = _full_state()
        sharded = _shard(full, mesh)
        manager = CheckpointManager(root)
        path = manager.save(
            5,
            model=sharded["model"],
            optimizer=sharded["optimizer"],
            scheduler=None,
            trainer_state={"global_step": 5},
        )
        manager.verify(path)  # ranks split the hashing

        target = _shard({k: {n: torch.zeros_like(t) for n, t in v.items()} if k == "model" else
                         {"state": {0: {n: torch.zeros_like(t) for n, t in v["state"][0].items()}}}
                         for k, v in full.items()}, mesh)
        manager.load_into(path, component="model", target=target["model"])
        manager.load_into(path, component="optimizer", target=target["optimizer"])
        for name, tensor in target["model"].items():
            assert isinstance(tensor, DTensor)
            assert torch.equal(tensor.to_local(), sharded["model"][name].to_local()), name
        assert torch.equal(target["optimizer"]["state"][0]["exp_avg"].full_tensor(),
                           full["optimizer"]["state"][0]["exp_avg"])
        assert target["optimizer"]["state"][0]["step"].item() == 3.0
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_save_at_world_size_2_loads_anywhere(tmp_path: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(
        _worker, args=(str(tmp_path / "ckpt"), str(tmp_path / "pg_init")), nprocs=2, join=True,
        # Fork: torch is already imported here; spawn re-imports it (~20 s on a busy 2-core box). But a
        # forked child inherits a process group an earlier test of this process started, and gloo's
        # threads are not forked with it: then spawn.
        start_method="spawn" if dist.is_initialized() else "fork",
    )
    path = tmp_path / "ckpt" / "global_step_5"
    manifest_files = sorted(p.name for p in (path / "model").glob("*.safetensors"))
    assert len(manifest_files) == 2  # one shard file per rank
    assert sorted(p.name for p in (path / "rng").iterdir()) == ["rank_00000.json", "rank_00001.json"]

    loaded = CheckpointManager(tmp_path / "ckpt").load(path)  # world size 1, no process group
    full = _full_state()
    for name, tensor in full["model"].items():
        assert loaded.model[name].dtype == tensor.dtype and torch.equal(loaded.model[name], tensor), name
    assert torch.equal(loaded.optimizer["state"][0]["exp_avg"], full["optimizer"]["state"][0]["exp_avg"])
    assert loaded.manifest["world_size"] == 2
