"""The few collective operations the manager needs, as no-ops without a process group."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["all_gather_objects", "barrier", "rank_and_world"]


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    if not _active():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    if _active():
        dist.barrier()


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (in-memory pickling between our own ranks; nothing is read from disk)."""
    if not _active():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
