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
from safetensors.torch import save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.tensor import DTensor

from grpo_ckpt.hashed_writer import write_safetensors_hashed
from grpo_ckpt.manifest import FileRecord

__all__ = ["has_tensor_files", "load_full_tensors", "load_tensors_into", "save_tensors"]

SUFFIX = ".safetensors"
SINGLE_FILE = "shard-00001-model-00001-of-00001.safetensors"  # the name DCP gives rank 0's file


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    # DCP warns "assuming the intent is to save in a single process" on every call without a process
    # group; for us that is the normal single-process case, not news.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def save_tensors(directory: Path, tensors: dict[str, torch.Tensor], *, threads: int = 1) -> dict[str, FileRecord]:
    """Collective when a process group exists: every rank calls it with the same keys.

    Plain tensors are taken as replicated (DCP writes one copy); DTensors are written shard by shard.
    In a single process without DTensors the one file DCP would write is written directly, hashed on
    the way (`hashed_writer`); its {file name: size/sha256} is returned so nobody re-reads it.
    Otherwise returns {} and the caller hashes the files.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if not _distributed() and not any(isinstance(t, DTensor) for t in tensors.values()):
        try:
            return {SINGLE_FILE: write_safetensors_hashed(directory / SINGLE_FILE, tensors)}
        except KeyError:  # a dtype without a safetensors name: let the library decide
            save_file(_unshared(tensors), directory / SINGLE_FILE)
            return {}
    # torch < 2.14's HF writer hands tied (storage-sharing) tensors to safetensors, which refuses them.
    tensors = {**tensors, **_unshared({k: t for k, t in tensors.items() if not isinstance(t, DTensor)})}
    writer = HuggingFaceStorageWriter(str(directory), save_distributed=True, thread_count=threads)
    with _quiet_single_process():
        dcp.save(tensors, storage_writer=writer, no_dist=not _distributed())
    return {}


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors that share storage (tied embeddings): give later ones their own copy.
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach()
        storage = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if storage in seen and tensor.numel() else tensor.contiguous()
        seen.add(storage)
    return out


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
