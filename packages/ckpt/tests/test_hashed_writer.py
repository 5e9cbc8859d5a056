from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from grpo_ckpt.hashed_writer import SAFETENSORS_DTYPES, write_safetensors_hashed


def test_every_dtype_reads_back_with_the_safetensors_library(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {f"{dtype}".removeprefix("torch."): (torch.randn(3, 5, generator=gen) * 50).to(dtype)
               for dtype in SAFETENSORS_DTYPES if dtype not in (torch.uint16, torch.uint32, torch.uint64)}
    shared = torch.randn(4, 4, generator=gen)
    tensors.update({
        "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3), "transposed": torch.randn(3, 4, generator=gen).t(),
        "tied_a": shared, "tied_b": shared,  # safetensors.save_file would refuse shared storage
        "odd_bytes": torch.ones(3, dtype=torch.int8),  # 3 bytes, then 8-byte tensors must stay aligned
    })
    record = write_safetensors_hashed(tmp_path / "x.safetensors", tensors)

    data = (tmp_path / "x.safetensors").read_bytes()
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    header_len = struct.unpack("<Q", data[:8])[0]
    assert header_len % 8 == 0
    loaded = load_file(tmp_path / "x.safetensors")
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    header = json.loads(data[8 : 8 + header_len])
    for name, entry in header.items():
        if name != "__metadata__":  # every tensor starts at a multiple of its element size
            assert entry["data_offsets"][0] % tensors[name].element_size() == 0, name


def test_large_tensor_is_hashed_across_chunks(tmp_path: Path) -> None:
    big = torch.arange(20 << 20, dtype=torch.int32)  # 80 MiB: several 32 MiB chunks
    record = write_safetensors_hashed(tmp_path / "big.safetensors", {"big": big})
    assert record["sha256"] == hashlib.sha256((tmp_path / "big.safetensors").read_bytes()).hexdigest()
    assert torch.equal(load_file(tmp_path / "big.safetensors")["big"], big)
