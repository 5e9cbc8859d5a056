"""Bucketing and packing of HF-named tensors for the vLLM weight sync (no vLLM import here).

A bucket is a list of `(name, tensor)` whose bytes add up to at most the bucket size (a single
tensor larger than that travels alone). It crosses to the engine process as one flat `bytes`
payload plus a metadata list of plain values, which vLLM's msgpack transport carries as-is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

# [name, dtype (e.g. "bfloat16"), shape, byte offset, byte length]
TensorMeta = tuple[str, str, list[int], int, int]

# Each tensor starts at a multiple of this, so a byte slice can be viewed as any dtype.
ALIGN_BYTES = 16


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


def pack_bucket(bucket: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorMeta], bytes]:
    """Copy a bucket's tensors (any device) into one contiguous CPU byte string."""
    meta: list[TensorMeta] = []
    offset = 0
    for name, tensor in bucket:
        nbytes = tensor.numel() * tensor.element_size()
        meta.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
    flat = torch.zeros(offset, dtype=torch.uint8)
    for (_, tensor), (_, _, _, start, nbytes) in zip(bucket, meta, strict=True):
        if nbytes:
            source = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            flat[start : start + nbytes].copy_(source)
    return meta, flat.numpy().tobytes()


def unpack_bucket(meta: list[TensorMeta], payload: bytes) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `pack_bucket`: CPU tensors that view one writable copy of `payload`."""
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    tensors: list[tuple[str, torch.Tensor]] = []
    for name, dtype_name, shape, start, nbytes in meta:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"weight sync: tensor {name!r} has unknown dtype {dtype_name!r}")
        tensors.append((name, flat[start : start + nbytes].view(dtype).reshape(shape)))
    return tensors
