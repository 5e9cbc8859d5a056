"""What both sides of bench_grpo_vs_trl.py run (one `BenchSpec`, derived from our resolved
TrainerConfig so there is a single source of truth) and what each side reports (`SideResult`)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Ray's own (case-sensitive) setting for its workers' niceness; Ray's default is 15.
RAY_NICENESS_ENV = "RAY_worker_niceness"


@dataclass(frozen=True, kw_only=True)
class BenchSpec:
    model_dir: str
    train_files: list[str]
    seed: int
    # Rollout.
    prompts_per_step: int  # data.train_batch_size
    n: int  # completions per prompt (rollout.n == TRL num_generations)
    max_prompt_length: int
    max_response_length: int
    temperature: float
    top_p: float
    top_k: int  # <= 0: off
    # Update.
    mini_batch_prompts: int  # actor.ppo_mini_batch_size: one optimizer step per mini-batch
    micro_batch_rows: int  # actor.ppo_micro_batch_size_per_device
    ppo_epochs: int
    lr: float
    lr_warmup_steps: int
    weight_decay: float
    grad_clip: float
    dtype: str
    gradient_checkpointing: bool
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    loss_agg_mode: str
    clip_ratio_low: float
    clip_ratio_high: float
    norm_adv_by_std: bool
    adv_eps: float
    # Reward: reward.custom_fn ("package.module:function", the tiny preset's task) or, when None, the
    # function registered for each row's data_source.
    reward_custom_fn: str | None
    # Resources and measurement.
    world_size: int  # our data-parallel worker processes
    threads: int  # CPU threads in total, each side
    warmup_steps: int
    measure_steps: int
    overrides: list[str] = field(default_factory=list)  # applied to our config (and so to this spec)

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measure_steps

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.n

    @property
    def optimizer_steps_per_rollout(self) -> int:
        return self.prompts_per_step // self.mini_batch_prompts * self.ppo_epochs

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> BenchSpec:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def spec_from_config(
    cfg: Any, *, threads: int, warmup_steps: int, measure_steps: int, overrides: list[str]
) -> BenchSpec:
    """The bench spec of a resolved `grpo_config.TrainerConfig`."""
    if cfg.algorithm.adv_estimator != "grpo":
        raise ValueError(f"only adv_estimator=grpo is compared with TRL, got {cfg.algorithm.adv_estimator!r}")
    if cfg.data.train_batch_size % cfg.actor.ppo_mini_batch_size:
        raise ValueError("data.train_batch_size must be a multiple of actor.ppo_mini_batch_size")
    return BenchSpec(
        model_dir=cfg.actor.model_path,
        train_files=list(cfg.data.train_files),
        seed=cfg.seed,
        prompts_per_step=cfg.data.train_batch_size,
        n=cfg.rollout.n,
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.rollout.max_tokens or cfg.data.max_response_length,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        mini_batch_prompts=cfg.actor.ppo_mini_batch_size,
        micro_batch_rows=cfg.actor.ppo_micro_batch_size_per_device,
        ppo_epochs=cfg.actor.ppo_epochs,
        lr=cfg.actor.lr,
        lr_warmup_steps=cfg.actor.lr_warmup_steps,
        weight_decay=cfg.actor.weight_decay,
        grad_clip=cfg.actor.grad_clip,
        dtype=cfg.actor.dtype,
        gradient_checkpointing=cfg.actor.gradient_checkpointing,
        use_kl_loss=cfg.actor.use_kl_loss,
        kl_loss_coef=cfg.actor.kl_loss_coef,
        kl_loss_type=cfg.actor.kl_loss_type,
        loss_agg_mode=cfg.actor.loss_agg_mode,
        clip_ratio_low=cfg.actor.clip_ratio_low,
        clip_ratio_high=cfg.actor.clip_ratio_high,
        norm_adv_by_std=cfg.algorithm.norm_adv_by_std,
        adv_eps=cfg.algorithm.adv_eps,
        reward_custom_fn=cfg.reward.custom_fn,
        world_size=cfg.device.nnodes * cfg.device.devices_per_node,
        threads=threads,
        warmup_steps=warmup_steps,
        measure_steps=measure_steps,
        overrides=list(overrides),
    )


@dataclass(kw_only=True)
class SideResult:
    """One side's measurement. Steps are GRPO steps: one rollout of `completions_per_step`
    sequences and every optimizer step made on it."""

    name: str
    setup_s: float  # process start -> first step begins (imports, model load, workers)
    step_s: list[float]  # wall time of each measured step (warm-up excluded)
    cpu_s: list[float]  # CPU time (user + system) of the side's whole process tree, each measured step
    generated_tokens: int  # response tokens sampled in the measured steps (EOS included)
    trained_tokens: int  # non-padding prompt+response tokens of the measured steps' batches
    rewards: list[float]  # mean reward of every step, warm-up included
    notes: list[str] = field(default_factory=list)  # what this side does, in words

    @property
    def wall_s(self) -> float:
        return sum(self.step_s)

    @property
    def steps_per_s(self) -> float:
        return len(self.step_s) / self.wall_s

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def cpu_s_per_step(self) -> float:
        return sum(self.cpu_s) / len(self.cpu_s)

    @property
    def generated_tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s

    @property
    def trained_tokens_per_s(self) -> float:
        return self.trained_tokens / self.wall_s

    @classmethod
    def merge(cls, rounds: list[SideResult]) -> SideResult:
        """Several rounds of one side as one measurement (their measured steps pooled)."""
        first = rounds[0]
        return cls(
            name=first.name,
            setup_s=sum(r.setup_s for r in rounds) / len(rounds),
            step_s=[t for r in rounds for t in r.step_s],
            cpu_s=[t for r in rounds for t in r.cpu_s],
            generated_tokens=sum(r.generated_tokens for r in rounds),
            trained_tokens=sum(r.trained_tokens for r in rounds),
            rewards=[x for r in rounds for x in r.rewards],
            notes=first.notes,
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> SideResult:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def tree_cpu_seconds(root_pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants (reaped children included):
    what a side costs in CPU, whatever else the shared machine runs meanwhile."""
    import psutil

    root = psutil.Process(root_pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def per_step(boundaries: list[float], *, first_measured: int) -> list[float]:
    """Differences of consecutive boundaries (boundary 0: the first step begins), measured steps only."""
    return [boundaries[i + 1] - boundaries[i] for i in range(first_measured, len(boundaries) - 1)]
