"""Our side of bench_grpo_vs_trl.py: `grpo_trainer.train(cfg)` on the tiny preset, timed from the
trainer's own per-step console event ("train.step", logged right after each step's metrics are
written) and its per-step metrics JSONL (response lengths, trained tokens, rewards)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import structlog
from _trl_spec import RAY_NICENESS_ENV, BenchSpec, SideResult, per_step, tree_cpu_seconds


def bench_overrides(workdir: Path, *, total_steps: int) -> list[str]:
    """Applied after the user's overrides: no validation and no checkpoint until the last step (TRL
    does neither in its timed loop), a fresh run, and the console event the clock listens to."""
    return [
        f"total_training_steps={total_steps}",
        "test_freq=-1",
        "val_before_train=false",
        "checkpoint.save_freq=-1",
        "checkpoint.resume=none",
        f"checkpoint.dir={workdir / 'checkpoints'}",
        f"logging.dir={workdir / 'runs'}",
        "logging.plot=false",
        "logging.console=true",
    ]


def load_config(preset_dir: Path, run_dir: Path, *, user_overrides: list[str], total_steps: int) -> Any:
    import grpo_config
    from grpo_launch import tiny_preset

    return grpo_config.load(
        tiny_preset(preset_dir), [*user_overrides, *bench_overrides(run_dir, total_steps=total_steps)]
    )


class StepEventClock:
    """A structlog processor noting when each "train.step" event is emitted, and the CPU time
    of this process tree (driver, Ray's processes, workers, reward workers) by then."""

    def __init__(self) -> None:
        self.ends: dict[int, float] = {}
        self.cpu: dict[int, float] = {}

    def __call__(self, logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        if event_dict.get("event") == "train.step":
            step = int(event_dict["step"])
            self.ends[step] = time.perf_counter()
            self.cpu[step] = tree_cpu_seconds(os.getpid())
        return event_dict


def notes(cfg: Any, spec: BenchSpec) -> list[str]:
    threads = max(1, (os.cpu_count() or 1) // spec.world_size)
    a = cfg.actor
    kl = (
        f"{a.kl_loss_type} KL to a frozen reference, coef={a.kl_loss_coef}"
        if a.use_kl_loss
        else "no KL, no reference"
    )
    return [
        f"grpo_trainer.train, {spec.world_size} Ray worker(s) (DDP over gloo) x {threads} torch thread(s), "
        f"workers at nice {os.environ.get(RAY_NICENESS_ENV, '15 (Ray default)')}",
        f"rollout: {cfg.rollout.engine} engine on the policy module, "
        f"{spec.completions_per_step // spec.world_size} sequences per worker",
        (
            "old log-probs: the rollout engine's (algorithm.rollout_correction.bypass_mode=true), not recomputed"
            if cfg.algorithm.rollout_correction.bypass_mode
            else "old log-probs recomputed"
        )
        + f", {kl}",
        f"{spec.optimizer_steps_per_rollout} optimizer step(s) per rollout, "
        f"micro-batch {a.ppo_micro_batch_size_per_device} rows per worker, loss_agg_mode={a.loss_agg_mode}",
        "MoE experts implementation: eager (grpo_trainer's choice on CPU); gradient checkpointing "
        + ("on" if a.gradient_checkpointing else "off"),
        "the checkpoint saved after the last step is not in the step times (its CPU time is)",
    ]


def run_ours(spec: BenchSpec, *, preset_dir: Path, workdir: Path, process_start: float) -> SideResult:
    from grpo_trainer.driver.metrics import read_metrics
    from grpo_trainer.trainer import train

    clock = StepEventClock()
    structlog.configure(
        processors=[
            clock,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(colors=False),
        ]
    )
    cfg = load_config(preset_dir, workdir, user_overrides=spec.overrides, total_steps=spec.total_steps)
    result = train(cfg)
    metrics = read_metrics(result.metrics_path)
    if sorted(clock.ends) != list(range(1, spec.total_steps + 1)) or len(metrics) != spec.total_steps:
        raise RuntimeError(
            f"saw step events {sorted(clock.ends)} and {len(metrics)} metric rows, expected {spec.total_steps}"
        )
    w = spec.warmup_steps
    steps = range(1, spec.total_steps + 1)
    first_begin = clock.ends[1] - metrics[1]["timing/step_s"]
    measured = range(w + 1, spec.total_steps + 1)
    # The trainer always saves after the last step (as verl does), before that step's event; TRL
    # saves nothing in its timed loop: the saves' wall time is taken out of the step clock.
    saved = 0.0
    ends = []
    for s in steps:
        saved += metrics[s].get("timing/save_s", 0.0)
        ends.append(clock.ends[s] - saved)
    return SideResult(
        name="ours",
        setup_s=first_begin - process_start,
        step_s=per_step([first_begin, *ends], first_measured=w),
        # Step 1's CPU start is unknown; it is never measured when warmup_steps >= 1.
        cpu_s=per_step([float("nan")] + [clock.cpu[s] for s in steps], first_measured=w),
        generated_tokens=round(
            sum(metrics[s]["response_length/mean"] * spec.completions_per_step for s in measured)
        ),
        trained_tokens=round(
            sum(metrics[s]["perf/tokens_per_s"] * metrics[s]["timing/step_s"] for s in measured)
        ),
        rewards=[metrics[s]["reward/mean"] for s in range(1, spec.total_steps + 1)],
        notes=notes(cfg, spec),
    )
