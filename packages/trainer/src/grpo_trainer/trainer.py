"""The GRPO loop: `train(cfg)` and `_Run`, whose `train_step` reads top to bottom as the algorithm
does (sample -> log-probs -> advantages -> loss mask -> update -> after the update); sampling is
the rollout mode's (`driver.rollout_modes`). docs/ARCHITECTURE.md follows one step through the wings.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import torch
from tqdm.auto import tqdm

import grpo_config
from grpo_config.replicas import RolloutReplicas
from grpo_config.schema import TrainerConfig
from grpo_device import DeviceKind
from grpo_trainer.algo import grpo_math
from grpo_trainer.algo.lr_schedule import with_warmup_steps
from grpo_trainer.algo.reward_shaping import KLController, kl_reward_penalty
from grpo_trainer.algo.rollout_correction import RolloutCorrection, mismatch_metrics
from grpo_trainer.batching import pad_generations, rank_shards, response_budget
from grpo_trainer.data import PromptItem, ResumableSampler, datasets_for
from grpo_trainer.data.images import load_processor
from grpo_trainer.devices import resolve_device_kind, with_device_kind
from grpo_trainer.driver.metrics import MetricsLogger, WandbRun, pick_val_generations, plot_metrics
from grpo_trainer.driver.resume_layout import (
    LAYOUT_KEY,
    check_resume_layout,
    checkpoint_layout,
    layout_change,
)
from grpo_trainer.driver.rollout_modes import RolloutMode, make_rollout_mode
from grpo_trainer.driver.rounds import RoundPlanner, VisionCache
from grpo_trainer.driver.run_checks import check_model_path, check_target_step
from grpo_trainer.driver.sampling import Rollout, gather_rollout, reward_items, rollout_metrics
from grpo_trainer.driver.scoring import Scorer
from grpo_trainer.driver.timing import PhaseTimer
from grpo_trainer.protocols import PolicyBatch
from grpo_trainer.rewards import RewardManager
from grpo_trainer.rollout.multi_turn import tool_loop
from grpo_trainer.workers.group import ensure_ray, shutdown_ray
from grpo_trainer.workers.policy_worker import HF_EXPORT_DIR
from grpo_trainer.workers.policy_workers import PolicyWorkers, process_count

log = structlog.get_logger()


class NoLearningSignalError(ValueError):
    """Steps in a row (`max_zero_advantage_steps`) whose advantages were all zero."""


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    final_step: int
    metrics_path: Path | None
    plot_path: Path | None
    checkpoint_dir: Path
    rewards: dict[int, float] = field(default_factory=dict)  # step -> mean training reward
    resumed_from: Path | None = None
    wall_time_s: float = 0.0


class _Run:
    """State of one `train` call: the data, the rewards, the algorithm's state and the step count;
    its methods are the step, validation, resume and save."""

    def __init__(self, cfg: TrainerConfig) -> None:
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(
            cfg.actor.model_path, trust_remote_code=cfg.actor.trust_remote_code
        )
        data = cfg.data
        processor = load_processor(cfg.actor.model_path, trust_remote_code=cfg.actor.trust_remote_code)
        self.tools = tool_loop(cfg, self.tokenizer)
        schemas = self.tools.schemas if self.tools else None
        self.train_data, self.val_data = datasets_for(data, self.tokenizer, processor, tools=schemas)
        self.sampler = ResumableSampler(
            len(self.train_data),
            batch_size=data.gen_batch_size or data.train_batch_size,
            seed=data.seed,
            shuffle=data.shuffle,
        )
        self.kl_controller = KLController(cfg.algorithm.kl_ctrl)
        self.correction = RolloutCorrection(cfg.algorithm.rollout_correction)
        self.total_steps = cfg.total_training_steps or cfg.total_epochs * len(self.sampler)
        self.cfg = cfg = with_warmup_steps(cfg, self.total_steps)  # what the workers are built with
        self.rewards = RewardManager(
            cfg.reward.timeout_s,
            cfg.reward.custom_fn,
            custom_fn_name=cfg.reward.custom_fn_name,
            num_workers=cfg.reward.num_workers,
            grader=cfg.reward.grader,
        )
        max_tokens = response_budget(cfg)
        self.scorer = Scorer(cfg.reward, self.rewards, decode=self.decode, max_tokens=max_tokens)
        self.planner = RoundPlanner(
            cfg.rollout, replicas=RolloutReplicas.for_config(cfg).count, seed=cfg.seed, max_tokens=max_tokens
        )
        self.vision = VisionCache(processor)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.workers: PolicyWorkers | None = None
        self.mode: RolloutMode | None = None
        self.step = 0
        self.reward_history: dict[int, float] = {}
        self.resumed_metrics: dict[str, float] | None = None  # the resumed checkpoint's step record
        self.zero_advantage_steps = 0  # steps in a row whose advantages were all zero
        self.last_advantages: torch.Tensor | None = None

    def start_workers(self) -> None:
        self.workers = PolicyWorkers(self.cfg)
        self.mode = make_rollout_mode(
            self.cfg,
            self.workers,
            planner=self.planner,
            scorer=self.scorer,
            vision=self.vision,
            sampler=self.sampler,
            total_steps=self.total_steps,
            tools=self.tools,
        )

    # -- the step ---------------------------------------------------------------------------------
    def train_step(self, next_prompts: Callable[[], list[PromptItem]]) -> dict[str, float]:
        """One GRPO step on `next_prompts()` (called again for each further generation round of
        dynamic sampling, and by one-step-off for the next step's prompts)."""
        cfg, workers, mode, timer = self.cfg, self._workers(), self._mode(), PhaseTimer()
        started = time.perf_counter()

        sampled = mode.sample(self.step, next_prompts, timer)
        rollout = sampled.rollout
        batch = pad_generations(
            [item.prompt_ids for item in rollout.items], rollout.generations, pad_token_id=self.pad_token_id
        )
        if any(item.images for item in rollout.items):
            batch.vision = [self.vision.of(item) for item in rollout.items]
        self.vision.keep_only(mode.prompts_in_flight())
        shards = rank_shards(cfg, batch, workers.dp_size)

        rollout_log_probs = batch.rollout_log_probs
        assert rollout_log_probs is not None  # pad_generations gave them
        bypass = cfg.algorithm.rollout_correction.bypass_mode
        if bypass:  # the engine's log-probs are the old policy's (zeros off the responses, as pad_rows')
            batch.old_log_probs = rollout_log_probs
        else:
            with timer("old_log_probs"):
                batch.old_log_probs = workers.log_probs(batch, shards)
        if cfg.uses_reference_model:
            with timer("ref_log_probs"):
                batch.ref_log_probs = workers.log_probs(batch, shards, ref=True)

        metrics = dict(sampled.metrics)
        final_rewards, kl_metrics = self.final_rewards(sampled.rewards, batch)
        metrics.update(kl_metrics)
        with timer("advantages"):
            batch.advantages = self.advantages(final_rewards, rollout.group_ids)
        self.last_advantages = batch.advantages

        positions = batch.response_mask  # every response token (the loss mask may lose some next)
        metrics.update(self.correct(batch, rollout))

        with timer("update"):
            update = workers.update(
                batch,
                shards,
                num_mini_batches=cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size,
                ppo_epochs=cfg.actor.ppo_epochs,
            )
        mode.after_update(self.step, timer)

        scores, advantages = sampled.scores, batch.advantages
        metrics.update(rollout_metrics(rollout, rewards=scores, advantages=advantages, scored=sampled.scored))
        if not torch.equal(final_rewards, sampled.scores):
            metrics["reward/final_mean"] = float(final_rewards.mean())
        metrics.update({f"actor/{name}": value for name, value in update.items()})
        if not bypass:  # in bypass mode the two are the same tensor
            drift = (batch.old_log_probs - rollout_log_probs).abs()
            metrics["rollout/logprob_abs_diff"] = float(grpo_math.masked_mean(drift, positions))
            metrics.update(mismatch_metrics(batch.old_log_probs, rollout_log_probs, positions))
        elapsed = time.perf_counter() - started
        metrics.update(timer.metrics)
        metrics["timing/step_s"] = elapsed
        metrics["perf/tokens_per_s"] = float(batch.attention_mask.sum()) / max(elapsed, 1e-9)
        return metrics

    def final_rewards(self, rewards: torch.Tensor, batch: PolicyBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The rewards the advantages read: with algorithm.use_kl_in_reward, less beta times each
        sequence's KL to the reference (old log-probs against reference log-probs)."""
        if not self.cfg.algorithm.use_kl_in_reward:
            return rewards, {}
        if batch.old_log_probs is None or batch.ref_log_probs is None:
            raise ValueError("the KL penalty in the reward needs the batch's old and reference log-probs")
        penalty, metrics = kl_reward_penalty(
            batch.old_log_probs,
            batch.ref_log_probs,
            batch.response_mask,
            kind=self.cfg.algorithm.kl_penalty,
            controller=self.kl_controller,
        )
        return rewards - penalty.to(rewards.dtype), metrics

    def advantages(self, rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
        """The per-response advantage of `algorithm.adv_estimator`: GRPO's (as `norm_adv_by_std` /
        `adv_eps` say) or RLOO's leave-one-out one."""
        algorithm = self.cfg.algorithm
        if algorithm.adv_estimator == "rloo":
            return grpo_math.rloo_advantages(rewards, group_ids)
        return grpo_math.group_advantages(
            rewards, group_ids, norm_by_std=algorithm.norm_adv_by_std, eps=algorithm.adv_eps
        )
    def correct(self, batch: PolicyBatch, rollout: Rollout) -> dict[str, float]:
        """The loss mask and weights of the update: rollout correction (on every response, so its
        statistics are verl's), then overlong filtering."""
        metrics: dict[str, float] = {}
        if self.correction.enabled:
            assert batch.old_log_probs is not None
            fix = self.correction.apply(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask)
            batch.response_mask = fix.response_mask
            batch.rollout_is_weights = fix.is_weights
            metrics.update(fix.metrics)
        if self.cfg.algorithm.overlong_filter:
            cut = torch.tensor([g.finish_reason == "length" for g in rollout.generations])
            batch.response_mask = batch.response_mask * (~cut).to(batch.response_mask.dtype).unsqueeze(-1)
            metrics["rollout/overlong_filtered_fraction"] = float(cut.double().mean())
        return metrics
    def check_learning_signal(self, advantages: torch.Tensor) -> None:
        """Count steps in a row whose advantages are all zero; past `max_zero_advantage_steps`, stop
        with the cause (each group's rewards were equal)."""
        limit = self.cfg.max_zero_advantage_steps
        self.zero_advantage_steps = 0 if bool(torch.any(advantages != 0)) else self.zero_advantage_steps + 1
        if limit <= 0 or self.zero_advantage_steps < limit:
            return
        recent = [self.reward_history[s] for s in sorted(self.reward_history)[-limit:]]
        raise NoLearningSignalError(
            f"the advantages were all zero in each of the last {limit} steps (to step {self.step}): every "
            f"group's {self.cfg.rollout.n} responses got equal rewards (mean rewards of those steps: "
            f"{', '.join(f'{r:g}' for r in recent)}), so nothing is learned. A reward that cannot tell "
            "responses apart, or a task the model always or never solves, does this: check reward.custom_fn "
            "and the data (or max_zero_advantage_steps=0 to train on regardless)."
        )
    def decode(self, token_ids: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
    def validate(self) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
        """The validation set's mean reward (overall and per data source) and the samples
        `logging.val_generations` asks to log (prompt, response, score)."""
        if self.val_data is None:
            return {}, []
        items = [self.val_data[i] for i in range(len(self.val_data))]
        round_ = self.planner.validation(items)
        rollout = gather_rollout(round_.chunks, self._mode().generate(round_, step=self.step), n=round_.n)
        texts = self.decode([g.token_ids for g in rollout.generations])
        scores = self.rewards.score(reward_items(rollout.items, texts)).scores
        metrics = {"val/reward_mean": sum(scores) / max(len(scores), 1)}
        by_source: dict[str, list[float]] = {}
        for item, score in zip(rollout.items, scores, strict=True):
            by_source.setdefault(item.data_source, []).append(score)
        for source, values in by_source.items():
            metrics[f"val/{source}/reward_mean"] = sum(values) / len(values)
        count = self.cfg.logging.val_generations
        if not count:
            return metrics, []
        prompts = self.tokenizer.batch_decode([item.prompt_ids for item in rollout.items], skip_special_tokens=True)
        return metrics, pick_val_generations(prompts, texts, scores, count)

    # -- resume / checkpoint ----------------------------------------------------------------------
    def maybe_resume(self) -> Path | None:
        from grpo_ckpt import CheckpointManager
        from grpo_ckpt.manifest import read_manifest

        path = CheckpointManager(self.cfg.checkpoint.dir).resolve_resume(self.cfg.checkpoint.resume)
        if path is None:
            return None
        resumed = self._workers().load(path)
        if self.cfg.checkpoint.export_hf and "hf_export" not in read_manifest(path):
            # A run stopped during this step's HF export: the training state is whole, the export is not.
            shutil.rmtree(path / HF_EXPORT_DIR, ignore_errors=True)
            log.warning("train.hf_export_redone", path=str(path), reason="its export did not finish")
            self._workers().export_checkpoint_hf(path)
        self.resumed_metrics = resumed.trainer_state.get("metrics")
        self.step = int(resumed.trainer_state["global_step"])
        self.kl_controller.load_state_dict(resumed.trainer_state.get("kl_controller"))
        self.reward_history = {int(k): float(v) for k, v in resumed.trainer_state.get("rewards", {}).items()}
        if resumed.dataloader_state is not None:
            self.sampler.load_state_dict(resumed.dataloader_state)
        log.info("train.resumed", path=str(path), step=self.step)
        return path

    def save(self, metrics: dict[str, float]) -> Path:
        """A checkpoint of this step; it carries the step's metrics so that a run killed between
        the save and the metrics record can write that record when it resumes."""
        trainer_state = {
            "global_step": self.step,
            "total_steps": self.total_steps,
            "rewards": {str(k): v for k, v in self.reward_history.items()},
            "metrics": metrics,
            "kl_controller": self.kl_controller.state_dict(),
            LAYOUT_KEY: checkpoint_layout(self.cfg),
        }
        # The prompts of a generation in flight are drawn again after a resume.
        in_flight = self._mode().sampler_state_in_flight()
        return self._workers().save(
            self.step,
            trainer_state=trainer_state,
            dataloader_state=in_flight if in_flight is not None else self.sampler.state_dict(),
        )
    def _workers(self) -> PolicyWorkers:
        if self.workers is None:
            raise RuntimeError("workers are not started")
        return self.workers

    def _mode(self) -> RolloutMode:
        if self.mode is None:
            raise RuntimeError("workers are not started")
        return self.mode

    def close(self, *, started_ray: bool) -> None:
        self.rewards.close()
        if self.mode is not None:
            self.mode.close()
        if self.workers is not None:
            self.workers.close()
        if started_ray:
            shutdown_ray()


def run_dir(cfg: TrainerConfig) -> Path:
    """Where a run's metrics.jsonl and metrics.png go: `<logging.dir>/<project_name>/<experiment_name>`
    (TensorBoard's events under `<logging.dir>/tensorboard/` in the same two folders, so one
    TensorBoard over `<logging.dir>/tensorboard` shows each experiment as its own run)."""
    return Path(cfg.logging.dir) / cfg.project_name / cfg.experiment_name


def _is_due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


def train(cfg: TrainerConfig, *, ray_runtime_env: dict[str, Any] | None = None) -> TrainResult:
    """Run GRPO as configured by `cfg` (from `grpo_config.load`) and return where things went.

    Resumes per `checkpoint.resume` ("auto": the latest complete checkpoint under
    `checkpoint.dir`, if any). A worker that raises, dies or outlives its phase's `timeouts.*`
    limit stops the run with `WorkerError`. `ray_runtime_env` is the Ray job's runtime env when
    this call starts Ray (the launchers' logging set-up for every worker: `logging.level`).
    `checkpoint.dir` is locked for the run: a second run into it raises FolderInUseError."""
    from grpo_ckpt import RunLock

    with RunLock(cfg.checkpoint.dir, what="checkpoint.dir"):
        return _train(cfg, ray_runtime_env=ray_runtime_env)


def _train(cfg: TrainerConfig, *, ray_runtime_env: dict[str, Any] | None) -> TrainResult:
    from grpo_ckpt import CheckpointManager

    wall_start = time.perf_counter()
    cfg = with_device_kind(cfg)  # detected once, here; the workers read it
    check_model_path(cfg.actor.model_path)
    ignored = grpo_config.inert_settings(cfg)
    if ignored:
        log.warning("config.ignored", settings={", ".join(keys): why for keys, why in ignored})
    # Before anything heavy: a checkpoint of the other backend, or without Megatron state, is refused.
    resume_from = CheckpointManager(cfg.checkpoint.dir).resolve_resume(cfg.checkpoint.resume)
    check_resume_layout(cfg, resume_from)
    change = layout_change(cfg, resume_from)
    if change:
        log.info("train.resume_resharded", path=str(resume_from), layout=change)
    run = _Run(cfg)
    if resume_from is not None:
        check_target_step(resume_from, total_steps=run.total_steps)
    cpus = (os.cpu_count() or 1) if resolve_device_kind(cfg) is DeviceKind.CPU else None
    processes = process_count(cfg)
    started_ray = ensure_ray(num_cpus=max(cpus, processes) if cpus else None, runtime_env=ray_runtime_env)
    log_dir = run_dir(cfg)
    logger = MetricsLogger(
        log_dir,
        console=cfg.logging.console,
        jsonl=cfg.logging.jsonl,
        tensorboard=cfg.logging.tensorboard,
        tensorboard_dir=Path(cfg.logging.dir) / "tensorboard" / cfg.project_name / cfg.experiment_name,
        wandb=WandbRun(cfg.project_name, cfg.experiment_name, grpo_config.to_dict(cfg)) if cfg.logging.wandb else None,
    )
    try:
        run.start_workers()
        resumed_from = run.maybe_resume()
        moved = logger.rewind(run.step)
        if moved:
            log.warning("train.metrics_rewound", step=run.step, moved=moved, to="metrics.abandoned.jsonl")
        if run.step >= run.total_steps:
            log.warning(
                "train.already_complete",
                step=run.step,
                total_steps=run.total_steps,
                hint="raise total_training_steps (or total_epochs) to train on, or give the run another folder",
            )
        if run.resumed_metrics is not None and run.step not in logger.logged_steps():
            logger.log(run.step, run.resumed_metrics, console=False)  # killed after the save, before the record
        if cfg.val_before_train and resumed_from is None and run.val_data is not None:
            val_metrics, samples = run.validate()
            logger.log(0, val_metrics)
            logger.log_generations(0, samples)
        batches = itertools.chain.from_iterable(itertools.repeat(run.sampler))  # epoch after epoch
        with tqdm(total=run.total_steps, initial=run.step, desc="train", unit="step", disable=None) as bar:
            while run.step < run.total_steps:
                metrics = run.train_step(lambda: [run.train_data[i] for i in next(batches)])
                run.step += 1
                run.reward_history[run.step] = metrics["reward/mean"]
                if run.last_advantages is not None:
                    run.check_learning_signal(run.last_advantages)
                timer = PhaseTimer()
                samples: list[tuple[str, str, float]] = []
                if cfg.test_freq > 0 and _is_due(run.step, cfg.test_freq, run.total_steps):
                    with timer("validate"):
                        val_metrics, samples = run.validate()
                        metrics.update(val_metrics)
                if _is_due(run.step, cfg.checkpoint.save_freq, run.total_steps):
                    with timer("save"):
                        run.save({**metrics, **timer.metrics})
                metrics.update(timer.metrics)
                logger.log(run.step, metrics)
                logger.log_generations(run.step, samples)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
        logger.close()
        plot_path = None
        if cfg.logging.plot and logger.jsonl_path is not None:
            plot_path = plot_metrics(logger.jsonl_path, log_dir / "metrics.png")
        wall = time.perf_counter() - wall_start
        log.info("train.done", final_step=run.step, wall_time_s=round(wall, 1), plot=str(plot_path))
        return TrainResult(
            final_step=run.step,
            metrics_path=logger.jsonl_path,
            plot_path=plot_path,
            checkpoint_dir=Path(cfg.checkpoint.dir),
            rewards=dict(sorted(run.reward_history.items())),
            resumed_from=resumed_from,
            wall_time_s=wall,
        )
    finally:
        logger.close()
        run.close(started_ray=started_ray)
