"""The algorithms on the tiny preset (CPU, 2 ranks), each beside the preset's own run (GRPO, PPO
clip 0.2/0.2, token-mean): does the reward rise, at what cost per step, and what the algorithm
itself reports (importance-weight statistics, dynamic sampling's rounds and dropped groups).

    hatch run python bench/algorithms_tiny.py                 # every variant, 50 steps each
    hatch run python bench/algorithms_tiny.py --only tis gspo --steps 30
    hatch run python bench/algorithms_tiny.py rollout.engine=vllm rollout.dtype=bfloat16 --only grpo tis   # overrides first

Each variant runs in its own process (its own Ray cluster) under a fresh folder; the table is
printed at the end with the command lines, to paste into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS: dict[str, list[str]] = {
    "grpo": [],
    "tis": ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0"],
    # The same algorithm as "tis" with one-step-off rollout: one training rank and one rollout
    # worker of its own (the 2 cores split the same way as the 2 training ranks of the others).
    "one_step_off": [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        "device.devices_per_node=1",
        "rollout.mode=one_step_off",
        "rollout.devices_per_node=1",
    ],
    "gspo": [
        "actor.policy_loss.loss_mode=gspo",
        "actor.loss_agg_mode=seq-mean-token-mean",
        "actor.clip_ratio_low=0.0003",
        "actor.clip_ratio_high=0.0004",
    ],
    "cispo": ["actor.policy_loss.loss_mode=cispo", "actor.clip_ratio_low=10", "actor.clip_ratio_high=0.2"],
    "dapo": [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=10",
        "data.gen_batch_size=24",
        "actor.clip_ratio_high=0.28",
        "reward.overlong_buffer.enable=true",
        "reward.overlong_buffer.len=2",
        "reward.overlong_buffer.penalty_factor=0.1",
        "reward.overlong_buffer.log=true",
    ],
    "kl_in_reward": [
        "actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "algorithm.kl_ctrl.target_kl=0.05",
    ],
}

CHILD = """
import sys
from pathlib import Path
import grpo_config
from grpo_launch import tiny_preset
from grpo_trainer import train
train(grpo_config.load(tiny_preset(Path(sys.argv[1])), sys.argv[2:]))
"""


def _mean(records: dict[int, dict[str, float]], key: str, steps: range) -> float:
    values = [records[s][key] for s in steps if s in records and key in records[s]]
    return statistics.fmean(values) if values else float("nan")


def run_variant(name: str, overrides: list[str], *, steps: int, workdir: Path) -> dict[str, float]:
    from grpo_trainer import read_metrics

    args = [f"total_training_steps={steps}", "checkpoint.save_freq=-1", "checkpoint.export_hf=false", *overrides]
    print(f"== {name}: {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-c", CHILD, str(workdir), *args], check=True, stdout=subprocess.DEVNULL)
    records = read_metrics(workdir / "runs" / "grpo" / "tiny" / "metrics.jsonl")
    first, last = range(1, 11), range(steps - 9, steps + 1)
    row = {
        "reward_first10": _mean(records, "reward/mean", first),
        "reward_last10": _mean(records, "reward/mean", last),
        "val_last": next((records[s]["val/reward_mean"] for s in sorted(records, reverse=True) if "val/reward_mean" in records[s]), float("nan")),
        "step_s": statistics.median(records[s]["timing/step_s"] for s in records if s > 1),
        # Training throughput: every step's wall (generation, waits and sync included).
        "steps_per_s": len(records) / sum(records[s]["timing/step_s"] for s in records),
        "logprob_gap": _mean(records, "rollout_corr/max_abs_log_prob_diff", range(1, steps + 1)),  # per step max
    }
    if "rollout_corr/rollout_is_mean" in records[1]:
        row["is_mean"] = _mean(records, "rollout_corr/rollout_is_mean", range(1, steps + 1))
        row["is_frac_high"] = _mean(records, "rollout_corr/rollout_is_ratio_fraction_high", range(1, steps + 1))
    if "rollout/staleness" in records[1]:
        row["staleness"] = _mean(records, "rollout/staleness", range(1, steps + 1))
        row["generate_s"] = statistics.median(records[s]["timing/generate_s"] for s in records if s > 1)
        row["generate_wait_s"] = statistics.median(records[s]["timing/generate_wait_s"] for s in records if s > 1)
    if "train/num_gen_batches" in records[1]:
        row["rounds"] = sum(records[s]["train/num_gen_batches"] for s in records)
        row["dropped"] = sum(records[s]["dynamic_sampling/groups_dropped"] for s in records)
        row["generated"] = sum(records[s]["dynamic_sampling/groups_generated"] for s in records)
        row["rounds_first10"] = sum(records[s]["train/num_gen_batches"] for s in first)
        row["rounds_last10"] = sum(records[s]["train/num_gen_batches"] for s in last)
        # reward_last10 is over the kept groups (mixed ones); this is over everything generated.
        row["reward_generated_last10"] = _mean(records, "dynamic_sampling/reward_mean_generated", last)
    if "actor/reward_kl_penalty_coeff" in records[steps]:
        row["kl_coef_last"] = records[steps]["actor/reward_kl_penalty_coeff"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", nargs="*", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("overrides", nargs="*", help="dotted overrides added to every run")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="grpo-algorithms-") as tmp:
        for name in args.only:
            rows[name] = run_variant(name, [*VARIANTS[name], *args.overrides], steps=args.steps, workdir=Path(tmp) / name)
    print(f"\n{args.steps} steps each; extra overrides: {' '.join(args.overrides) or '(none)'}")
    order = ["reward_first10", "reward_last10", "reward_generated_last10", "val_last", "step_s", "steps_per_s",
             "staleness", "generate_s", "generate_wait_s", "logprob_gap",
             "is_mean", "is_frac_high", "rounds", "rounds_first10", "rounds_last10", "generated", "dropped", "kl_coef_last"]
    keys = [k for k in order if any(k in row for row in rows.values())]
    print("| variant | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.4g}" if k in row else "" for k in keys) + " |")


if __name__ == "__main__":
    main()
