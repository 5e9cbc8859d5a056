"""GRPO steps/s and tokens/s: our trainer vs Hugging Face TRL's GRPOTrainer, side by side, on CPU.

    hatch run bench:grpo-vs-trl                  # 2 rounds x (1 warm-up + 5 measured steps) per side
    hatch run bench:grpo-vs-trl --steps 3 actor.ppo_epochs=2    # dotted overrides go to both sides
    hatch run bench:grpo-vs-trl --recompute-old-log-probs       # ours recomputes old log-probs as TRL does

Both sides get the tiny preset's model directory (random-weight Qwen3.5-MoE), its train parquet, the
group size (rollout.n == num_generations), max response length, sampling settings, optimizer steps
per rollout (train_batch_size / ppo_mini_batch_size x ppo_epochs), AdamW settings, KL on/off, the
reward our config names (the tiny task's `reward.custom_fn`), and the same parallel layout: as many
processes as our Ray workers (TRL through torchrun + accelerate, DDP over gloo), one torch thread
each on 2 cores. Each side runs in its own process tree, one after the other; rounds alternate
which side goes first and their measured steps are pooled.

A step is one GRPO step: a rollout of train_batch_size x n sequences and every optimizer step made
on it. Timed: wall time from the end of the warm-up to the end of the last step (setup, i.e.
imports, model load, Ray and its workers, is reported apart), and the CPU time of the side's whole
process tree over the same steps (robust to other jobs on a shared machine, which the wall time is
not). tokens/s: sampled response tokens (EOS included), and non-padding prompt+response tokens of
the trained batches, per second of wall time. Speed-ups are ours over TRL (goal: >= 2.0x steps/s, issue #18).

Ours takes the old policy's log-probs from its colocated hf engine (`BYPASS` below: the engine is the
policy module in float32, so they are the recomputation's up to float rounding); TRL recomputes
them with a forward pass, as ours does with `--recompute-old-log-probs`. Both lines are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _trl_spec import RAY_NICENESS_ENV, BenchSpec, SideResult, spec_from_config

PROCESS_START = time.perf_counter()
GOAL = 2.0
# The colocated hf engine samples with the policy module itself in float32: its log-probs of the
# sampled tokens are the old policy's up to float rounding, so ours skips recomputing them (verl's
# bypass mode). TRL has no such setting: it recomputes whenever it makes more than one optimizer step
# per generation, as here.
BYPASS = "algorithm.rollout_correction.bypass_mode=true"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="dotted config overrides for the tiny preset (both sides)")
    p.add_argument("--steps", type=int, default=5, help="measured GRPO steps per side")
    p.add_argument("--warmup", type=int, default=1, help="untimed GRPO steps first")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="run both sides this many times, alternating which goes first; measured steps are pooled",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads in total for TRL")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--only", choices=("both", "grpo", "trl"), default="both")
    p.add_argument(
        "--trl-procs",
        type=int,
        default=None,
        help="TRL processes (torchrun; accelerate runs DDP over gloo); default: as many as our workers",
    )
    p.add_argument(
        "--trl-batch-rows",
        type=int,
        default=None,
        help="TRL per_device_train_batch_size (default: our micro-batch x workers / TRL processes)",
    )
    p.add_argument(
        "--trl-experts",
        default="eager",
        help="TRL model's MoE experts implementation: eager (what ours uses on CPU) or default (transformers')",
    )
    p.add_argument(
        "--recompute-old-log-probs",
        action="store_true",
        help="ours recomputes the old log-probs as TRL does (default: it takes the hf engine's, "
        f"{BYPASS}: the engine samples with the policy's own float32 weights)",
    )
    p.add_argument("--timeout-s", type=float, default=900.0, help="per side")
    p.add_argument("--json", type=Path, default=None, help="also write both results here")
    # Internal: run one side in this process.
    p.add_argument("--side", choices=("grpo", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1 and --warmup >= 0")
    return args


def run_side(args: argparse.Namespace) -> None:
    spec = BenchSpec.load(args.spec)
    workdir = args.spec.parent
    if args.side == "grpo":
        from _trl_ours import run_ours

        result = run_ours(
            spec, preset_dir=workdir / "preset", workdir=workdir / "grpo", process_start=PROCESS_START
        )
    else:
        from _trl_side import run_trl

        result = run_trl(
            spec,
            workdir=workdir / "trl",
            process_start=PROCESS_START,
            batch_rows=args.trl_batch_rows,
            experts=args.trl_experts,
        )
    if result is not None:  # None: a TRL process other than rank 0
        result.save(args.result)


def side_env(side: str) -> dict[str, str]:
    """Ray starts its workers at nice 15 (RAY_worker_niceness); TRL's processes run at 0. On a
    machine shared with other jobs that alone decides who gets the cores, so ours gets 0 too
    unless the caller set it."""
    env = dict(os.environ)
    if side == "grpo":
        env.setdefault(RAY_NICENESS_ENV, "0")
    return env


def spawn(side: str, spec_path: Path, args: argparse.Namespace, *, round_index: int) -> SideResult:
    result_path = spec_path.parent / f"result_{side}_{round_index}.json"
    script = [
        str(Path(__file__).resolve()),
        *("--side", side, "--spec", str(spec_path), "--result", str(result_path)),
        *("--trl-experts", args.trl_experts),
    ]
    procs = args.trl_procs or BenchSpec.load(spec_path).world_size
    if side == "trl" and procs > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={procs}",
            *script,
        ]
    else:
        cmd = [sys.executable, *script]
    if args.trl_batch_rows:
        cmd += ["--trl-batch-rows", str(args.trl_batch_rows)]
    print(
        f"== round {round_index}, {side}: {args.warmup} warm-up + {args.steps} measured steps ...", flush=True
    )
    log_path = spec_path.parent / f"{side}_{round_index}.log"
    result_path.unlink(missing_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s, check=False, env=side_env(side)
        )
    return side_outcome(side, proc.returncode, result_path=result_path, log_path=log_path)


def side_outcome(side: str, returncode: int, *, result_path: Path, log_path: Path) -> SideResult:
    """The side's result. A side that wrote its result and then exited non-zero (seen: a TRL rank
    aborting in its process-group teardown) keeps the result, and the exit and the log's last lines
    are printed; a side that wrote none fails the bench with them."""
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:]) if returncode != 0 else ""
    if not result_path.exists():
        raise SystemExit(f"{side} side failed (exit {returncode}) without a result; last lines of {log_path}:\n{tail}")
    if returncode != 0:
        print(
            f"!! {side} side exited {returncode} after writing its result (kept: its steps were measured); "
            f"the cause, last lines of {log_path}:\n{tail}",
            flush=True,
        )
    return SideResult.load(result_path)


def make_spec(args: argparse.Namespace, workdir: Path) -> BenchSpec:
    from _trl_ours import load_config

    total = args.warmup + args.steps
    overrides = [*([] if args.recompute_old_log_probs else [BYPASS]), *args.overrides]
    cfg = load_config(workdir / "preset", workdir / "grpo", user_overrides=overrides, total_steps=total)
    return spec_from_config(
        cfg,
        threads=args.threads,
        warmup_steps=args.warmup,
        measure_steps=args.steps,
        overrides=overrides,
    )


def describe(spec: BenchSpec) -> str:
    return (
        f"tiny preset model {spec.model_dir}\n"
        f"step = {spec.prompts_per_step} prompts x n={spec.n} = {spec.completions_per_step} sequences, "
        f"max response {spec.max_response_length} tokens (prompts <= {spec.max_prompt_length}), "
        f"T={spec.temperature} top_p={spec.top_p}; {spec.optimizer_steps_per_rollout} optimizer step(s) per rollout; "
        f"dtype {spec.dtype}; {spec.warmup_steps} warm-up + {spec.measure_steps} measured steps per round; "
        f"{os.cpu_count()} CPU cores"
    )


# (label, value of a side, format, speed-up of ours: "rate" = ours / TRL, "time" = TRL / ours, None)
ROWS = [
    ("GRPO steps/s", lambda r: r.steps_per_s, "{:.3f}", "rate"),
    ("s/step, mean", lambda r: r.wall_s / len(r.step_s), "{:.2f}", "time"),
    ("s/step, median", lambda r: r.median_step_s, "{:.2f}", "time"),
    ("s/step, fastest", lambda r: min(r.step_s), "{:.2f}", "time"),
    ("CPU s/step, all procs", lambda r: r.cpu_s_per_step, "{:.2f}", "time"),
    ("generated tokens/s", lambda r: r.generated_tokens_per_s, "{:.1f}", "rate"),
    ("trained tokens/s", lambda r: r.trained_tokens_per_s, "{:.1f}", "rate"),
    ("generated tokens/step", lambda r: r.generated_tokens / len(r.step_s), "{:.0f}", None),
    ("setup s (untimed)", lambda r: r.setup_s, "{:.1f}", None),
    ("mean reward, all steps", lambda r: sum(r.rewards) / len(r.rewards), "{:.3f}", None),
]


def report(spec: BenchSpec, results: dict[str, SideResult]) -> str:
    names = list(results)
    both = len(names) == 2
    lines = [describe(spec), ""]
    lines.append(f"{'':24}" + "".join(f"{n:>12}" for n in names) + ("   ours speed-up" if both else ""))
    for label, get, fmt, kind in ROWS:
        values = [get(results[n]) for n in names]
        line = f"{label:24}" + "".join(f"{fmt.format(v):>12}" for v in values)
        if both and kind is not None:
            speedup = values[0] / values[1] if kind == "rate" else values[1] / values[0]
            line += f"   {speedup:14.2f}x"
        lines.append(line)
    for name in names:
        lines.append(f"\n{name} does:")
        lines += [f"  - {note}" for note in results[name].notes]
        lines.append("  step times s: " + ", ".join(f"{t:.2f}" for t in results[name].step_s))
    if both:
        ratio = results["ours"].steps_per_s / results["TRL"].steps_per_s
        verdict = "met" if ratio >= GOAL else "NOT met"
        lines.append(f"\nsteps/s ours/TRL = {ratio:.2f}x (goal >= {GOAL}x: {verdict})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side:
        run_side(args)
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="grpo_vs_trl_"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec = make_spec(args, workdir)
    spec_path = workdir / "spec.json"
    spec.save(spec_path)
    sides = [s for s in ("grpo", "trl") if args.only in ("both", s)]
    rounds: dict[str, list[SideResult]] = {s: [] for s in sides}
    for index in range(args.rounds):
        for side in sides if index % 2 == 0 else sides[::-1]:
            rounds[side].append(spawn(side, spec_path, args, round_index=index))
    names = {"grpo": "ours", "trl": "TRL"}
    results = {names[s]: SideResult.merge(rounds[s]) for s in sides}
    print(report(spec, results))
    print(f"\nlogs and results: {workdir}")
    if args.json:
        args.json.write_text(json.dumps({n: vars(r) for n, r in results.items()}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
