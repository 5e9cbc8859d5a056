"""Where a profiled update leaves the GPU idle: reads a Chrome trace of torch's profiler (what
`bench/megatron_gpu_run.py --profile --trace` writes, gzipped or not) and prints the GPU's busy and
idle time over the update, the host synchronisations, and the idle gaps summed by the Python code that
launched the kernel ending each gap (the innermost frames outside torch), largest first.

    python3 bench/trace_gaps.py /work/.device/N/mfu_0/trace_0.json.gz [--min-gap-us 20] [--top 25]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
CUDA_SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "ts" in e]


def _frame(name: str) -> bool:
    """A Python frame of ours or of a library we call, not torch's own."""
    return "torch/" not in name and not name.startswith("<built-in")


def analyse(events: list[dict[str, Any]], *, min_gap_us: float = 20.0, frames: int = 2) -> dict[str, Any]:
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e) for e in events if e.get("cat") in GPU_CATEGORIES)
    if not gpu:
        raise ValueError("the trace has no GPU events (was it profiled with ProfilerActivity.CUDA?)")
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    python = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["tid"], e["name"])
        for e in events
        if e.get("cat") == "python_function" and _frame(e["name"])
    )
    starts = [p[0] for p in python]

    def code_at(ts: float, tid: Any) -> str:
        around = [p for p in python[: bisect.bisect_right(starts, ts)] if p[1] >= ts and p[2] == tid]
        around.sort(key=lambda p: p[1] - p[0])  # innermost first
        return " < ".join(p[3] for p in around[:frames]) or "(no Python frame)"

    busy = 0.0
    end = gpu[0][0]
    gaps: dict[str, list[float]] = defaultdict(list)
    for start, stop, event in gpu:
        if start > end:
            gap = start - end
            if gap >= min_gap_us:
                launch = launches.get(event.get("args", {}).get("correlation"))
                where = code_at(float(launch["ts"]), launch["tid"]) if launch else "(no launch found)"
                gaps[where].append(gap)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - gpu[0][0]
    syncs: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cuda_runtime" and e["name"] in CUDA_SYNC_CALLS:
            syncs[e["name"]].append(float(e.get("dur", 0)))
    by_code = sorted(gaps.items(), key=lambda item: -sum(item[1]))
    return {
        "gpu_span_ms": span / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "gpu_idle_ms": (span - busy) / 1e3,
        "idle_in_gaps_over_min_ms": sum(sum(v) for v in gaps.values()) / 1e3,
        "gaps": [{"code": code, "gaps": len(v), "ms": round(sum(v) / 1e3, 3)} for code, v in by_code],
        "syncs": {name: {"calls": len(v), "ms": round(sum(v) / 1e3, 3)} for name, v in syncs.items()},
        "kernels": len(gpu),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--min-gap-us", type=float, default=20.0)
    parser.add_argument("--frames", type=int, default=2, help="innermost Python frames named per gap")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    result = analyse(load(args.trace), min_gap_us=args.min_gap_us, frames=args.frames)
    print(
        f"GPU span {result['gpu_span_ms']:.1f} ms: busy {result['gpu_busy_ms']:.1f}, idle {result['gpu_idle_ms']:.1f} "
        f"({result['idle_in_gaps_over_min_ms']:.1f} in gaps >= {args.min_gap_us:g} us); {result['kernels']} GPU events"
    )
    print("syncs:", json.dumps(result["syncs"]))
    for row in result["gaps"][: args.top]:
        print(f"{row['ms']:9.3f} ms {row['gaps']:6d} gaps  {row['code']}")


if __name__ == "__main__":
    main()
