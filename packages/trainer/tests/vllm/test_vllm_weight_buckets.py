"""Bucketing and packing for the vLLM weight sync: pure torch, runs in every env."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from grpo_trainer.rollout.vllm_weight_buckets import (
    ALIGN_BYTES,
    iter_buckets,
    pack_bucket,
    read_bucket_file,
    unpack_bucket,
    write_bucket_file,
)


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(10, 10, generator=g)),  # 400 B
        ("b.bias", torch.randn(3, generator=g).to(torch.bfloat16)),  # 6 B: next offset must realign
        ("c.weight", torch.randn(7, 5, generator=g).to(torch.float16).t()),  # non-contiguous
        ("d.scale", torch.tensor(2.5, dtype=torch.float64)),  # 0-dim
        ("e.ids", torch.arange(5, dtype=torch.int64)),
    ]


def test_pack_unpack_round_trip_is_exact_for_every_dtype_and_layout():
    bucket = _tensors()
    meta, payload = pack_bucket(bucket)
    assert all(offset % ALIGN_BYTES == 0 for _, _, _, offset, _ in meta)
    restored = unpack_bucket(meta, payload)
    assert [n for n, _ in restored] == [n for n, _ in bucket]
    for (_, want), (_, got) in zip(bucket, restored, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    restored[0][1].add_(1.0)  # writable, and a copy: the source is untouched
    assert not torch.equal(restored[0][1], bucket[0][1])


def test_file_round_trip_is_exact_and_survives_the_writer_deleting_the_file(tmp_path):
    bucket = _tensors()
    path = tmp_path / "bucket.bin"
    meta = write_bucket_file(bucket, path)
    assert meta == pack_bucket(bucket)[0]
    restored = read_bucket_file(meta, str(path))
    path.unlink()  # the reader's mapping stays valid
    for (_, want), (_, got) in zip(bucket, restored, strict=True):
        assert torch.equal(got, want)
    with pytest.raises(FileExistsError):  # never writes into a file another sync may be reading
        write_bucket_file(bucket, tmp_path / "taken.bin")
        write_bucket_file(bucket, tmp_path / "taken.bin")


def test_a_bucket_file_is_owner_only_whatever_the_umask(tmp_path):
    """Bucket files in /dev/shm hold the policy's weights while a sync runs: mode 0600 even
    under a umask of 0 (an open() with the default mode gave 0666 there: readable by every
    local user)."""
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = folder / f"grpo-test-bucket-{os.getpid()}.bin"
    previous = os.umask(0)
    try:
        write_bucket_file(_tensors(), path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert torch.equal(read_bucket_file(pack_bucket(_tensors())[0], str(path))[0][1], _tensors()[0][1])
    finally:
        os.umask(previous)
        path.unlink(missing_ok=True)


def test_buckets_respect_the_size_and_keep_order():
    tensors = [(f"t{i}", torch.zeros(100)) for i in range(10)]  # 400 B each
    buckets = list(iter_buckets(tensors, bucket_bytes=1000))
    assert [len(b) for b in buckets] == [2, 2, 2, 2, 2]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in tensors]


def test_a_tensor_larger_than_the_bucket_travels_alone():
    tensors = [("small", torch.zeros(10)), ("big", torch.zeros(1000)), ("small2", torch.zeros(10))]
    assert [[n for n, _ in b] for b in iter_buckets(tensors, bucket_bytes=100)] == [
        ["small"],
        ["big"],
        ["small2"],
    ]


def test_bucket_size_must_be_positive():
    with pytest.raises(ValueError, match="weight_sync_bucket_mb"):
        list(iter_buckets([("x", torch.zeros(1))], bucket_bytes=0))


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dtype 'nope'"):
        unpack_bucket([("x", "nope", [1], 0, 4)], b"\0" * 16)


def test_expert_weights_reported_under_the_moe_layer_name_count_as_loaded():
    from grpo_trainer.rollout.vllm_worker_ext import unloaded

    params = [
        "model.layers.0.mlp.experts.routed_experts.w13_weight",
        "model.layers.0.mlp.experts.routed_experts.w2_weight",
        "model.layers.0.mlp.gate.weight",
        "lm_head.weight",
    ]
    # vLLM 0.26's names for the first two (the H200 run's sync reported them missing).
    loaded = {"model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.experts.w2_weight", "model.layers.0.mlp.gate.weight"}
    assert unloaded(params, loaded) == ["lm_head.weight"]
    assert unloaded(params, set(params)) == []
    assert unloaded(params, set()) == sorted(params)
