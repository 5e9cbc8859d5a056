"""bench/trace_gaps.py on a trace written out by hand: the GPU's busy and idle time over the
update, and each idle gap charged to the Python code that launched the kernel ending it (the real
traces come from the GPU machine: docs/benchmarks.md)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from trace_gaps import analyse, load


def _trace() -> list[dict]:
    def kernel(ts: float, dur: float, corr: int) -> dict:
        return {"ph": "X", "cat": "kernel", "name": f"k{corr}", "ts": ts, "dur": dur, "args": {"correlation": corr}}

    def launch(ts: float, corr: int) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "tid": 1, "args": {"correlation": corr}}

    def frame(ts: float, dur: float, name: str) -> dict:
        return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": 1}

    return [
        frame(0, 200, "bench.py(10): update"),
        frame(1, 30, "ddp.py(5): backward_hook"),
        frame(40, 100, "optimizer.py(7): step"),
        frame(41, 90, "torch/optim/adamw.py(3): _fused"),  # torch's own frame: not named
        launch(2, 1),
        kernel(5, 10, 1),  # busy 5-15
        launch(20, 2),
        kernel(35, 10, 2),  # gap of 20 us, launched from backward_hook; busy 35-45
        launch(120, 3),
        kernel(125, 10, 3),  # gap of 80 us, launched from the optimizer step
        kernel(126, 4, 4),  # overlaps the one before: counted once
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 60, "dur": 50, "tid": 1, "args": {}},
        {"ph": "i", "name": "marker", "ts": 3},  # not a complete event
    ]


def test_idle_gaps_are_charged_to_the_code_that_launched_the_next_kernel(tmp_path: Path) -> None:
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": _trace()}, f)
    result = analyse(load(path), min_gap_us=20, frames=2)
    assert result["kernels"] == 4
    assert result["gpu_span_ms"] == 0.130 and result["gpu_busy_ms"] == 0.030
    assert abs(result["gpu_idle_ms"] - 0.100) < 1e-12
    assert result["gaps"] == [
        {"code": "optimizer.py(7): step < bench.py(10): update", "gaps": 1, "ms": 0.08},
        {"code": "ddp.py(5): backward_hook < bench.py(10): update", "gaps": 1, "ms": 0.02},
    ]
    assert result["syncs"] == {"cudaStreamSynchronize": {"calls": 1, "ms": 0.05}}
    assert analyse(load(path), min_gap_us=21)["idle_in_gaps_over_min_ms"] == 0.08
