"""The tiny preset through `train()` (Ray, PolicyWorker, checkpoints, resume) on one GPU with the
Megatron backend, side by side with the same run on the torch backend.

    PYTHONPATH=packages/launchers/common/src:packages/trainer/src:packages/config/src:packages/device/src:packages/ckpt/src \
        python bench/megatron_gpu_train.py --out $OUT [--steps 50] [--split 40] [--backends megatron,torch]

Each backend runs `total_training_steps=split` first, then a second `train()` with the full step
count resumes from the last checkpoint of the first and finishes the run. Printed per backend:
mean reward of the first and last 10 steps, seconds per step (median, steps after the first),
the resumed-from path, and the ratio megatron / torch of the step time. Results go to
OUT/megatron_gpu_train.json. Megatron settings: transformer_impl=local (no transformer_engine on
the GPU machine), bf16, distributed optimizer, grouped-GEMM experts; Gated DeltaNet through
megatron-core's torch delta rule (`deterministic_mode`: FLA 0.6's backward refuses Triton < 3.7.1
on Hopper). The torch backend trains the HF model in float32 under bf16 autocast; with
`--hide-from-torch` its workers do not see FLA, so transformers uses its torch delta rule too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

MEGATRON = [
    "actor.backend=megatron",
    "actor.dtype=bfloat16",
    "actor.megatron.transformer_impl=local",
    "actor.megatron.moe_grouped_gemm=true",
    "actor.megatron.moe_permute_fusion=true",
    "actor.megatron.apply_rope_fusion=true",
    "actor.megatron.moe_router_load_balancing_type=none",
    "actor.megatron.use_distributed_optimizer=true",
    'actor.megatron.override_transformer_config={"deterministic_mode": true}',
]
COMMON = ["device.devices_per_node=1", "logging.tensorboard=false"]


def run_backend(name: str, *, steps: int, split: int, device: str, workdir: Path) -> dict[str, Any]:
    import grpo_config
    from grpo_launch import tiny_preset
    from grpo_trainer import read_metrics, train

    overrides = [f"device.kind={device}", *COMMON, *(MEGATRON if name == "megatron" else [])]
    preset = tiny_preset(workdir)
    started = time.perf_counter()
    first = train(grpo_config.load(preset, [*overrides, f"total_training_steps={split}"]))
    second = train(grpo_config.load(preset, [*overrides, f"total_training_steps={steps}"]))
    wall = time.perf_counter() - started
    # The resumed run appends to the first run's file; read_metrics keeps the last record a step.
    by_step = {s: r for s, r in read_metrics(second.metrics_path).items() if "reward/mean" in r}
    rewards = [row["reward/mean"] for row in by_step.values()]
    step_times = [row["timing/step_s"] for s, row in by_step.items() if s > 1 and "timing/step_s" in row]
    result = {
        "backend": name,
        "final_step": second.final_step,
        "steps_logged": sorted(by_step),
        "resumed_from": str(second.resumed_from),
        "first_run_final_step": first.final_step,
        "reward_first10": statistics.fmean(rewards[:10]),
        "reward_last10": statistics.fmean(rewards[-10:]),
        "step_s_median": statistics.median(step_times) if step_times else None,
        "wall_s": wall,
        "first_run_wall_s": first.wall_time_s,
        "second_run_wall_s": second.wall_time_s,
        "last_row": by_step[max(by_step)],
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--split", type=int, default=40)
    parser.add_argument("--backends", default="megatron,torch")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script (torch backend)")
    parser.add_argument(
        "--hide-from-torch",
        default="",
        help="a PYTHONPATH entry the torch backend's Ray workers do not get (the FLA wheels: their "
        "Gated DeltaNet backward refuses Triton < 3.7.1 on Hopper, so transformers' torch path is used)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    pythonpath = os.environ.get("PYTHONPATH", "")
    for name in args.backends.split(","):
        # Each train() starts its own local Ray cluster, whose workers inherit this environment.
        entries = pythonpath.split(os.pathsep)
        if name == "torch" and args.hide_from_torch:
            entries = [e for e in entries if e != args.hide_from_torch]
        os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        try:
            results[name] = run_backend(
                name, steps=args.steps, split=args.split, device=args.device, workdir=Path(tempfile.mkdtemp())
            )
        except Exception:
            results[name] = {"error": traceback.format_exc()[-6000:]}
            traceback.print_exc()
        (args.out / "megatron_gpu_train.json").write_text(json.dumps(results, indent=2, default=str))
    mega, torch_run = results.get("megatron", {}), results.get("torch", {})
    if mega.get("step_s_median") and torch_run.get("step_s_median"):
        print(f"step time megatron / torch: {mega['step_s_median'] / torch_run['step_s_median']:.2f}x")
    sys.exit(1 if any("error" in r for r in results.values()) else 0)


if __name__ == "__main__":
    main()
