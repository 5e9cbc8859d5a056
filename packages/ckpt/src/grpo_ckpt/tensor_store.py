"""Tensors on disk: torch distributed checkpoint (DCP) with safetensors files.

`HuggingFaceStorageWriter(save_distributed=True)` makes every rank write its own shard as a plain
safetensors file, with the shard offsets in the safetensors header. `HuggingFaceStorageReader`
rebuilds the global metadata from those headers, so a checkpoint saved at one world size loads at any
other, and nothing on the read path unpickles (DCP's default `.metadata` file is a pickle).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

__all__ = ["has_tensor_files", "load_full_tensors", "load_tensors_into", "save_tensors"]

SUFFIX = ".safetensors"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    # DCP warns "assuming the intent is to save in a single process" on every call without a process
    # group; for us that is the normal single-process case, not news.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def save_tensors(directory: Path, tensors: dict[str, torch.Tensor], *, threads: int = 1) -> None:
    """Collective when a process group exists: every rank calls it with the same keys.

    Plain tensors are taken as replicated (DCP writes one copy); DTensors are written shard by shard.
    """
    directory.mkdir(parents=True, exist_ok=True)
    writer = HuggingFaceStorageWriter(str(directory), save_distributed=True, thread_count=threads)
    with _quiet_single_process():
        dcp.save(tensors, storage_writer=writer, no_dist=not _distributed())


def has_tensor_files(directory: Path) -> bool:
    return directory.is_dir() and any(p.name.endswith(SUFFIX) for p in directory.iterdir())


def load_full_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor at its full (unsharded) shape, on CPU, whatever world size saved it. Not collective."""
    reader = HuggingFaceStorageReader(str(directory))
    metadata = reader.read_metadata()
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
    }
    with _quiet_single_process():
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(directory)), no_dist=True)
    return state


def load_tensors_into(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Fill `tensors` in place (DTensor shards or full tensors). Collective when a process group exists."""
    missing = set(tensors) - set(HuggingFaceStorageReader(str(directory)).read_metadata().state_dict_metadata)
    if missing:
        raise ValueError(
            f"{directory} lacks tensors {sorted(missing)[:10]} (of {len(missing)}); "
            "the target state dict does not match what was saved"
        )
    with _quiet_single_process():
        dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(directory)), no_dist=not _distributed())
