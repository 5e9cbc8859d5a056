"""Bucketing and packing of HF-named tensors for the vLLM weight sync (no vLLM import here).

A bucket is a list of `(name, tensor)` whose bytes add up to at most the bucket size (a single
tensor larger than that travels alone). It is laid out as one flat byte buffer plus a metadata
list of plain values. The buffer crosses to the engine's workers either as a file in shared
memory (`write_bucket_file` / `read_bucket_file`: written once, the worker maps it) or, where no
shared memory is available, as `bytes` inside vLLM's RPC message (`pack_bucket` / `unpack_bucket`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

# [name, dtype (e.g. "bfloat16"), shape, byte offset, byte length]
TensorMeta = tuple[str, str, list[int], int, int]

# Each tensor starts at a multiple of this, so a byte slice can be viewed as any dtype.
ALIGN_BYTES = 16
# A bucket file's mode: the owner reads and writes (the umask can only narrow it).
OWNER_ONLY = 0o600


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors, in order, into buckets of at most `bucket_bytes` bytes."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1 (rollout.weight_sync_bucket_mb > 0)")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def bucket_layout(bucket: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorMeta], int]:
    """Metadata of each tensor (offsets aligned to ALIGN_BYTES) and the buffer's total size."""
    meta: list[TensorMeta] = []
    offset = 0
    for name, tensor in bucket:
        nbytes = tensor.numel() * tensor.element_size()
        meta.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
    return meta, offset


def _fill(flat: torch.Tensor, bucket: list[tuple[str, torch.Tensor]], meta: list[TensorMeta]) -> None:
    for (_, tensor), (_, _, _, start, nbytes) in zip(bucket, meta, strict=True):
        if nbytes:
            source = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            flat[start : start + nbytes].copy_(source)


def pack_bucket(bucket: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorMeta], bytes]:
    """Copy a bucket's tensors (any device) into one contiguous CPU byte string."""
    meta, total = bucket_layout(bucket)
    flat = torch.zeros(total, dtype=torch.uint8)
    _fill(flat, bucket, meta)
    return meta, flat.numpy().tobytes()


def write_bucket_file(bucket: list[tuple[str, torch.Tensor]], path: Path) -> list[TensorMeta]:
    """Write a bucket into a new file at `path` (meant for a shared-memory filesystem such as
    /dev/shm), readable and writable by its owner only whatever the umask: the policy's weights
    are not for other local users. Plain `write` calls, not a writable mapping: faster on tmpfs,
    and a full filesystem raises OSError instead of killing the process."""
    meta, total = bucket_layout(bucket)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY), "wb") as handle:
        for (_, tensor), (_, _, _, start, nbytes) in zip(bucket, meta, strict=True):
            if nbytes:
                handle.seek(start)
                handle.write(tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().data)
        handle.truncate(max(total, ALIGN_BYTES))
    return meta


def read_bucket_file(meta: list[TensorMeta], path: str) -> list[tuple[str, torch.Tensor]]:
    """Tensors viewing a private mapping of the file (no copy; the writer may delete the file
    once this returns, the mapping stays valid)."""
    size = max(max((start + nbytes for _, _, _, start, nbytes in meta), default=0), ALIGN_BYTES)
    flat = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    return _views(meta, flat)


def unpack_bucket(meta: list[TensorMeta], payload: bytes) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `pack_bucket`: CPU tensors that view one writable copy of `payload`."""
    return _views(meta, torch.frombuffer(bytearray(payload), dtype=torch.uint8))


def _views(meta: list[TensorMeta], flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    tensors: list[tuple[str, torch.Tensor]] = []
    for name, dtype_name, shape, start, nbytes in meta:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"weight sync: tensor {name!r} has unknown dtype {dtype_name!r}")
        tensors.append((name, flat[start : start + nbytes].view(dtype).reshape(shape)))
    return tensors
