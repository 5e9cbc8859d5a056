"""The production path on one GPU: `train()` with the Megatron actor and the vLLM rollout engine
colocated in one Ray worker (vLLM in-process through `external_launcher`), weight sync after every
update, sleep/wake around every rollout, expandable segments toggled, run with and without the
actor offloaded while the engine is awake; run `vl`: the tiny-vl preset (images through vLLM and
the Megatron actor's vision tower).

    PYTHONPATH=/tmp/site:packages/launchers/common/src:packages/trainer/src:packages/config/src:packages/device/src:packages/ckpt/src \
        VLLM_USE_FLASHINFER_SAMPLER=0 python bench/gpu_production_path.py --out $OUT [--steps 30]

Model: the tiny preset's random-weight Qwen3.5-MoE in Qwen3.5's real checkpoint layout
(`Qwen3_5MoeForConditionalGeneration`, what vLLM 0.26 loads; the Megatron backend trains its
language model through the text-only view) and the preset's task. Printed per run: reward of the
first and last 10 steps, per-phase seconds (median of steps 2..), weight-sync seconds, rollout
tokens/s, and the GPU's peak memory in use (nvidia-smi, every 0.2 s). Results in
OUT/gpu_production_path.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import tempfile
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from algorithms_tiny import VARIANTS
from megatron_gpu_train import MEGATRON

PHASES = ("generate", "generate_wait", "reward", "old_log_probs", "ref_log_probs", "update", "weight_sync", "step")
# Runs beside "resident" / "offload" (both plain GRPO): the algorithms, on the real rollout-training
# mismatch of vLLM (bf16) against the Megatron actor.
# The CPU benchmark's variants (bench/algorithms_tiny.py), DAPO without its overlong shaping.
ALGORITHMS: dict[str, list[str]] = {
    "tis": VARIANTS["tis"],
    "gspo": VARIANTS["gspo"],
    "dapo": [o for o in VARIANTS["dapo"] if not o.startswith("reward.overlong_buffer.")],
    # TIS with one-step-off rollout: the rollout worker (vLLM, awake throughout) in a Ray actor of
    # its own. This machine lends one GPU: both actors share it (`_one_gpu_for_two_actors`).
    "one_step_off": [*VARIANTS["one_step_off"], "rollout.free_cache_engine=false"],
}
REPORTED = (
    "rollout_corr/kl",
    "rollout_corr/max_abs_log_prob_diff",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_ratio_fraction_high",
    "rollout/staleness",
    "train/num_gen_batches",
    "dynamic_sampling/groups_dropped",
)


@contextlib.contextmanager
def _one_gpu_for_two_actors() -> Iterator[None]:
    """A Ray cluster that counts two GPUs and leaves CUDA_VISIBLE_DEVICES alone, so that the
    training actor and the rollout worker of rollout.mode=one_step_off (one GPU each) both run on
    the machine's one H200, time-sliced; a real deployment gives the rollout workers GPUs of their
    own (rollout.devices_per_node)."""
    import ray

    os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    ray.init(num_gpus=2, include_dashboard=False, log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()
        del os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]


class GpuMemoryPeak:
    """Peak `memory.used` (MiB) of GPU 0 while the block runs."""

    def __enter__(self) -> GpuMemoryPeak:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if out.isdigit():
                self.peak = max(self.peak, int(out))
            self._stop.wait(0.2)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def phase_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's median seconds over the metrics rows that time it."""
    return {
        p: statistics.median(r[f"timing/{p}_s"] for r in rows if f"timing/{p}_s" in r)
        for p in PHASES
        if any(f"timing/{p}_s" in r for r in rows)
    }


def rollout_tokens_per_s(rows: list[dict[str, Any]], sequences: int) -> float:
    """The median rollout throughput: response tokens generated a step over its generate seconds."""
    return statistics.median(r["response_length/mean"] * sequences / r["timing/generate_s"] for r in rows)


def production_megatron(*, torch_delta_rule: bool) -> list[str]:
    """The Megatron settings of these runs: MEGATRON's, with Gated DeltaNet on FLA's kernels as the
    GPU profile trains it, unless `torch_delta_rule` (megatron-core's pure-torch rule, which
    MEGATRON sets for the MFU benches: FLA's backward needs tilelang on Hopper with Triton 3.6)."""
    return [line for line in MEGATRON if torch_delta_rule or "deterministic_mode" not in line]


def run(name: str, *, offload: bool, steps: int, workdir: Path, torch_delta_rule: bool = False) -> dict[str, Any]:
    import grpo_config
    from grpo_launch import tiny_preset
    from grpo_launch.presets.tiny_vl import tiny_vl_preset
    from grpo_tiny.model import save_vision_language_layout
    from grpo_trainer import read_metrics, train

    if name == "vl":  # the tiny-vl preset: images through vLLM and the Megatron actor's vision tower
        preset = tiny_vl_preset(workdir)
        model_dir = Path(preset["actor"]["model_path"])
        engine_kwargs = '{"gdn_prefill_backend": "triton"}'
    else:
        preset = tiny_preset(workdir)
        model_dir = save_vision_language_layout(Path(preset["actor"]["model_path"]), workdir / "model_vl")
        engine_kwargs = '{"language_model_only": true, "gdn_prefill_backend": "triton"}'
    flags = "true" if offload else "false"
    overrides = [
        *production_megatron(torch_delta_rule=torch_delta_rule),
        f"actor.model_path={model_dir}",
        "device.kind=cuda",
        "device.devices_per_node=1",
        "device.expandable_segments=true",
        f"actor.megatron.param_offload={flags}",
        f"actor.megatron.grad_offload={flags}",
        f"actor.megatron.optimizer_offload={flags}",
        "rollout.engine=vllm",
        "rollout.enforce_eager=true",
        "rollout.gpu_memory_utilization=0.2",
        f"rollout.engine_kwargs={engine_kwargs}",
        f"total_training_steps={steps}",
        "test_freq=-1",
        "checkpoint.save_freq=-1",
        "checkpoint.export_hf=false",
        "logging.tensorboard=false",
        "logging.plot=false",
        *ALGORITHMS.get(name, []),
    ]
    shared = _one_gpu_for_two_actors() if name == "one_step_off" else contextlib.nullcontext()
    with shared, GpuMemoryPeak() as memory:
        result = train(grpo_config.load(preset, overrides))
    rows = {s: r for s, r in read_metrics(result.metrics_path).items() if "reward/mean" in r}
    later = [r for s, r in rows.items() if s > 1]
    rewards = [r["reward/mean"] for r in rows.values()]
    sequences = preset["data"]["train_batch_size"] * preset["rollout"]["n"]
    summary = {
        "run": name,
        "offload": offload,
        "final_step": result.final_step,
        "wall_s": result.wall_time_s,
        "reward_first10": statistics.fmean(rewards[:10]),
        "reward_last10": statistics.fmean(rewards[-10:]),
        "rewards": rewards,
        "phase_s_median": phase_medians(later),
        "step1_s": rows[1]["timing/step_s"],
        "steps_per_s": len(rows) / sum(r["timing/step_s"] for r in rows.values()),
        "rollout_tokens_per_s_median": rollout_tokens_per_s(later, sequences),
        "logprob_abs_diff_max": max(r["rollout/logprob_abs_diff"] for r in rows.values()),
        "grad_norms": [r.get("actor/grad_norm", float("nan")) for r in rows.values()],
        "gpu_memory_peak_mib": memory.peak,
        **{
            f"{key}_mean": statistics.fmean(r[key] for r in rows.values())
            for key in REPORTED
            if key in rows[1]
        },
    }
    if "train/num_gen_batches" in rows[1]:
        summary["gen_rounds_total"] = sum(r["train/num_gen_batches"] for r in rows.values())
        summary["groups_dropped_total"] = sum(r["dynamic_sampling/groups_dropped"] for r in rows.values())
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rewards", "grad_norms")}), flush=True)
    return summary


def verdict(name: str, result: dict[str, Any], steps: int) -> str:
    """One line: PASS when the run trained every step with finite rewards, grad norms and rollout
    log-prob gaps and synced weights; else FAIL and the first reason."""
    if "error" in result:
        return f"SMOKE FAIL {name}: " + result["error"].strip().splitlines()[-1][:300]
    numbers = [*result["rewards"], *result["grad_norms"], result["logprob_abs_diff_max"]]
    problems = [
        f"{result['final_step']}/{steps} steps" if result["final_step"] != steps else None,
        f"{len(result['rewards'])} steps logged a reward" if len(result["rewards"]) != steps else None,
        "a reward, grad norm or log-prob gap is not finite" if not all(map(math.isfinite, numbers)) else None,
        "no weight sync timed" if "weight_sync" not in result["phase_s_median"] else None,
    ]
    problems = [p for p in problems if p]
    phases = ", ".join(f"{p} {s:.3f}" for p, s in result["phase_s_median"].items())
    head = f"SMOKE FAIL {name}: {'; '.join(problems)}." if problems else f"SMOKE PASS {name}:"
    return (
        f"{head} {result['final_step']} steps, step 1 {result['step1_s']:.1f} s, then per phase (s, median) "
        f"{phases}; rollout {result['rollout_tokens_per_s_median']:.0f} tok/s, max |log-prob gap| "
        f"{result['logprob_abs_diff_max']:.3g}, GPU peak {result['gpu_memory_peak_mib']} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", default="offload,resident", help=f"comma- or +-separated: offload, resident, vl, {', '.join(ALGORITHMS)}")
    parser.add_argument("--verdict", action="store_true", help="print a SMOKE PASS/FAIL line per run (bench/gpu_session.sh smoke)")
    parser.add_argument("--torch-delta-rule", action="store_true",
                        help="megatron-core's pure-torch Gated DeltaNet rule instead of FLA's kernels (the profile's)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name in args.runs.replace("+", ",").split(","):
        try:
            results[name] = run(
                name, offload=name == "offload", steps=args.steps, workdir=Path(tempfile.mkdtemp()),
                torch_delta_rule=args.torch_delta_rule,
            )
        except Exception:
            results[name] = {"error": traceback.format_exc()[-8000:]}
            traceback.print_exc()
        (args.out / "gpu_production_path.json").write_text(json.dumps(results, indent=2, default=str))
    lines = [verdict(name, result, args.steps) for name, result in results.items()] if args.verdict else []
    print("\n".join(lines), flush=True)
    if any(line.startswith("SMOKE FAIL") for line in lines):
        raise SystemExit(1)
    raise SystemExit(1 if any("error" in r for r in results.values()) else 0)


if __name__ == "__main__":
    main()
