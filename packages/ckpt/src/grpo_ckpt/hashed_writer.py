"""Write a safetensors file and its sha256 in one pass over the bytes.

`safetensors.torch.save_file` followed by hashing reads every byte twice; here each tensor's bytes
are written straight from its storage (no serialised copy) while a second thread hashes the same
memory, and the file is fsynced. The layout follows the safetensors format: 8-byte little-endian
header size, a JSON header padded with spaces to 8 bytes, then the tensors back to back, ordered by
element size (largest first) so every tensor stays aligned. The result is read by the safetensors
library itself (and by DCP's HuggingFaceStorageReader).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

__all__ = ["SAFETENSORS_DTYPES", "write_safetensors_hashed"]

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}
_CHUNK = 32 << 20


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def write_safetensors_hashed(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, int | str]:
    """Write `tensors` to `path` (fsynced); return {"size", "sha256"} of the file.

    Raises KeyError for a dtype safetensors has no name for (callers fall back to save_file).
    """
    prepared = []
    for name, tensor in tensors.items():
        dtype_name = SAFETENSORS_DTYPES[tensor.dtype]
        prepared.append((name, dtype_name, tensor.detach().to("cpu").contiguous()))
    prepared.sort(key=lambda item: (-item[2].element_size(), item[0]))

    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype_name, tensor in prepared:
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": dtype_name, "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)

    digest = hashlib.sha256()
    size = 0
    with open(path, "wb") as handle, ThreadPoolExecutor(max_workers=1) as hasher:
        pending = []
        chunks = [memoryview(struct.pack("<Q", len(header_bytes))), memoryview(header_bytes)]
        chunks += [_as_bytes(tensor) for _, _, tensor in prepared]
        for chunk in chunks:
            for start in range(0, len(chunk), _CHUNK):
                piece = chunk[start : start + _CHUNK]
                pending.append(hasher.submit(digest.update, piece))  # one worker: updates stay in order
                handle.write(piece)
                size += len(piece)
        for future in pending:
            future.result()
        handle.flush()
        os.fsync(handle.fileno())
    return {"size": size, "sha256": digest.hexdigest()}
