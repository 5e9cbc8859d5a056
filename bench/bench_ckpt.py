"""Checkpoint save/load throughput: grpo_ckpt.CheckpointManager vs plain safetensors, same tensors.

    hatch run python bench/bench_ckpt.py --size-mb 512 --repeats 5

Half the bytes are a "model" (bf16 weights), half an AdamW-like optimizer state (fp32 exp_avg and
exp_avg_sq), all given to both sides as one flat dict for safetensors. CheckpointManager does more
per byte: DCP planning, fsync of every file, sha256 of every file on save (the manifest) and, with
verify=True, again on load. Loads are compared with load_file + clone (load_file alone maps the
file and reads nothing until touched). The page cache is warm for loads on both sides (nothing is dropped).
Reported: median seconds, GB/s, and grpo_ckpt / safetensors as a ratio (1.0 = as fast).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog
import torch
from safetensors.torch import load_file, save_file

from grpo_ckpt import CheckpointManager


def make_state(size_mb: int, tensor_mb: int) -> tuple[dict[str, torch.Tensor], dict]:
    gen = torch.Generator().manual_seed(0)
    n_params = max(1, size_mb // 2 // tensor_mb)
    elements_bf16 = tensor_mb * (1 << 20) // 2
    elements_fp32 = tensor_mb * (1 << 20) // 4 // 2  # exp_avg + exp_avg_sq share the optimizer half
    model = {f"layers.{i}.weight": torch.randn(elements_bf16, generator=gen).to(torch.bfloat16) for i in range(n_params)}
    optimizer = {
        "state": {
            i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(elements_fp32, generator=gen),
                "exp_avg_sq": torch.rand(elements_fp32, generator=gen)}
            for i in range(n_params)
        },
        "param_groups": [{"lr": 1e-6, "betas": (0.9, 0.999), "params": list(range(n_params))}],
    }
    return model, optimizer


def flat(model: dict[str, torch.Tensor], optimizer: dict) -> dict[str, torch.Tensor]:
    out = dict(model)
    for i, state in optimizer["state"].items():
        out.update({f"optimizer.{i}.{k}": v for k, v in state.items()})
    return out


def interleaved(ops: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per op; the ops take turns in every round, so a busy neighbour on a shared
    machine slows all of them alike instead of whichever happened to run then."""
    samples: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            start = time.perf_counter()
            op()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=512, help="total tensor bytes, MiB")
    parser.add_argument("--tensor-mb", type=int, default=32, help="size of one model tensor, MiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # the bench is the app

    model, optimizer = make_state(args.size_mb, args.tensor_mb)
    tensors = flat(model, optimizer)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    gb = nbytes / 1e9
    work = Path(tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir))
    plain = work / "plain.safetensors"
    root = work / "ckpt"
    manager = CheckpointManager(root, max_to_keep=1)
    step = iter(range(1, 10_000))

    def save_plain() -> None:
        plain.unlink(missing_ok=True)  # a new file each time, as a checkpoint is
        save_file(tensors, plain)

    def save_plain_fsync() -> None:
        save_plain()
        fd = os.open(plain, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def sha256_plain() -> None:
        with open(plain, "rb") as handle:
            hashlib.file_digest(handle, "sha256")

    def save_ours() -> None:
        manager.save(next(step), model=model, optimizer=optimizer, scheduler={"last_epoch": 1},
                     trainer_state={"global_step": 1})

    try:
        save_file(tensors, plain)  # warm-up: first-touch page allocation, imports
        save_ours()
        rows = interleaved({
            "safetensors save_file": save_plain,
            "safetensors save_file + fsync": save_plain_fsync,
            "grpo_ckpt save (fsync + sha256 + manifest)": save_ours,
            "  of which: sha256 of the file (hashlib)": sha256_plain,
        }, args.repeats)
        latest = manager.latest_complete()
        load_rows = interleaved({
            # load_file maps the file lazily: clone() makes it read every byte, as our load does.
            "safetensors load_file + clone": lambda: {k: v.clone() for k, v in load_file(plain).items()},
            "safetensors load_file (lazy mmap)": lambda: load_file(plain),
            "grpo_ckpt load (verify=True)": lambda: manager.load(latest),
            "grpo_ckpt load (verify=False)": lambda: manager.load(latest, verify=False),
        }, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"tensors: {len(tensors)}, {gb:.3f} GB; median of {args.repeats}; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'operation':42s} {'seconds':>8s} {'GB/s':>7s} {'vs plain':>9s}")
    base_save, base_load = rows["safetensors save_file"], load_rows["safetensors load_file + clone"]
    for name, seconds in rows.items():
        print(f"{name:42s} {seconds:8.3f} {gb / seconds:7.2f} {base_save / seconds:8.2f}x")
    for name, seconds in load_rows.items():
        print(f"{name:42s} {seconds:8.3f} {gb / seconds:7.2f} {base_load / seconds:8.2f}x")


if __name__ == "__main__":
    main()
