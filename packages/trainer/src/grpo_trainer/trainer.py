"""The GRPO loop: rollout -> reward -> advantages -> old/ref log-probs -> ppo_epochs x mini-batches
-> weight sync -> metrics -> checkpoint, with resume and periodic validation.

The driver (this process) holds data, rewards and metrics; the policy and its rollout engine live
in Ray worker actors, one per data-parallel rank (`worker.PolicyWorker`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from tqdm.auto import tqdm

from grpo_config.schema import TrainerConfig
from grpo_trainer import presets  # noqa: F401  (registers the built-in tiny task's reward)
from grpo_trainer.data import PromptDataset, PromptItem, ResumableSampler
from grpo_trainer.metrics import MetricsLogger, plot_metrics
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rewards import RewardManager
from grpo_trainer.rollout_step import run_rollout, split_ranks
from grpo_trainer.step_batch import dp_row_split, pad_rows, take_rows
from grpo_trainer.worker import PolicyWorker, resolve_device_kind
from grpo_trainer.worker_group import WorkerGroup, ensure_ray

log = structlog.get_logger()

CALL_TIMEOUT_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    final_step: int
    metrics_path: Path | None
    plot_path: Path | None
    checkpoint_dir: Path
    rewards: dict[int, float] = field(default_factory=dict)  # step -> mean training reward
    resumed_from: Path | None = None
    wall_time_s: float = 0.0


def _batches(sampler: ResumableSampler) -> Iterator[list[int]]:
    while True:
        yield from sampler


class _Run:
    """State of one `train` call; methods are the loop's phases."""

    def __init__(self, cfg: TrainerConfig, *, call_timeout_s: float) -> None:
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.call_timeout_s = call_timeout_s
        self.world_size = cfg.device.nnodes * cfg.device.devices_per_node
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.actor.model_path)
        data = cfg.data
        dataset_args = {
            "prompt_key": data.prompt_key,
            "max_prompt_length": data.max_prompt_length,
            "overlong": data.overlong_prompts,
            "apply_chat_template": data.apply_chat_template,
        }
        if not data.train_files:
            raise ValueError("data.train_files is empty: give at least one parquet/jsonl file")
        self.train_data = PromptDataset(data.train_files, self.tokenizer, **dataset_args)
        self.val_data = (
            PromptDataset(data.val_files, self.tokenizer, **dataset_args) if data.val_files else None
        )
        self.sampler = ResumableSampler(
            len(self.train_data), batch_size=data.train_batch_size, seed=data.seed, shuffle=data.shuffle
        )
        self.total_steps = cfg.total_training_steps or cfg.total_epochs * len(self.sampler)
        self.rewards = RewardManager(
            cfg.reward.timeout_s, cfg.reward.custom_fn, num_workers=cfg.reward.num_workers
        )
        self.max_tokens = cfg.rollout.max_tokens or data.max_response_length
        self.group: WorkerGroup | None = None
        self.dp_size = self.world_size
        self.dp_rank_of = list(range(self.world_size))
        self.step = 0
        self.reward_history: dict[int, float] = {}

    # -- workers ---------------------------------------------------------------------------
    def start_workers(self) -> None:
        from grpo_device import ray_resource_name

        kind = resolve_device_kind(self.cfg)
        resource = ray_resource_name(kind)
        cpus = max(1, (os.cpu_count() or 1) // self.world_size) if resource is None else 1
        self.group = WorkerGroup(
            PolicyWorker,
            world_size=self.world_size,
            resource=resource,
            cpus_per_worker=cpus,
            cfg=self.cfg,
            num_threads=cpus,
        )
        addr, port = self.group.call_rank(0, "rendezvous_address", timeout_s=self.call_timeout_s)
        ready = self.group.call("setup", master_addr=addr, master_port=port, timeout_s=self.call_timeout_s)
        self.dp_size = ready[0]["dp_size"]
        self.dp_rank_of = [info["dp_rank"] for info in ready]  # by worker rank

    def generate(
        self, prompts: list[list[list[int]]], params: list[SamplingParams]
    ) -> list[list[Generation]]:
        assert self.group is not None
        with tqdm(total=self.world_size, desc="rollout", unit="rank", leave=False, disable=None) as bar:
            return self.group.call(
                "generate",
                args_per_rank=[((p, sp), {}) for p, sp in zip(prompts, params, strict=True)],
                timeout_s=self.call_timeout_s,
                on_done=lambda _rank: bar.update(1),
            )

    def decode(self, token_ids: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)

    # -- resume / checkpoint ---------------------------------------------------------------
    def maybe_resume(self) -> Path | None:
        from grpo_ckpt import CheckpointManager

        path = CheckpointManager(self.cfg.checkpoint.dir).resolve_resume(self.cfg.checkpoint.resume)
        if path is None:
            return None
        assert self.group is not None
        state = self.group.call("load_checkpoint", path=str(path), timeout_s=self.call_timeout_s)[0]
        trainer_state = state["trainer_state"]
        self.step = int(trainer_state["global_step"])
        self.reward_history = {int(k): float(v) for k, v in trainer_state.get("rewards", {}).items()}
        if state["dataloader_state"] is not None:
            self.sampler.load_state_dict(state["dataloader_state"])
        log.info("train.resumed", path=str(path), step=self.step)
        return path

    def save(self) -> None:
        assert self.group is not None
        trainer_state = {
            "global_step": self.step,
            "total_steps": self.total_steps,
            "rewards": {str(k): v for k, v in self.reward_history.items()},
        }
        self.group.call(
            "save_checkpoint",
            step=self.step,
            trainer_state=trainer_state,
            dataloader_state=self.sampler.state_dict(),
            timeout_s=self.call_timeout_s,
        )

    # -- phases ----------------------------------------------------------------------------
    def sampling_params(self, *, validation: bool) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            n=r.val_n if validation else r.n,
            temperature=r.val_temperature if validation else r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=self.max_tokens,
        )

    def train_step(self, prompts: list[PromptItem]) -> dict[str, float]:
        assert self.group is not None
        started = time.perf_counter()
        cfg = self.cfg
        rollout = run_rollout(
            prompts,
            generate=self.generate,
            params=self.sampling_params(validation=False),
            world_size=self.world_size,
            step=self.step,
            seed=cfg.seed,
            decode=self.decode,
            reward_manager=self.rewards,
            norm_by_std=cfg.algorithm.norm_adv_by_std,
            eps=cfg.algorithm.adv_eps,
        )
        generated = time.perf_counter()
        batch = pad_rows(
            [item.prompt_ids for item in rollout.items],
            [g.token_ids for g in rollout.generations],
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0,
            rollout_log_probs=[g.logprobs for g in rollout.generations],
        )
        batch.advantages = rollout.advantages
        num_mini = cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size
        shards = dp_row_split(len(rollout.generations), num_mini_batches=num_mini, dp_size=self.dp_size)
        results = self.group.call(
            "train",
            args_per_rank=[((take_rows(batch, shards[dp_rank]),), {}) for dp_rank in self.dp_rank_of],
            num_mini_batches=num_mini,
            ppo_epochs=cfg.actor.ppo_epochs,
            timeout_s=self.call_timeout_s,
        )
        done = time.perf_counter()
        metrics = dict(rollout.metrics)
        metrics.update({k: v for k, v in results[0].items() if k.startswith(("actor/", "time/"))})
        diffs = [r["rollout/logprob_abs_diff"] for r in results if "rollout/logprob_abs_diff" in r]
        if diffs:
            metrics["rollout/logprob_abs_diff"] = sum(diffs) / len(diffs)
        tokens = float(batch.attention_mask.sum())
        metrics.update(
            {
                "time/rollout_s": generated - started,
                "time/train_s": done - generated,
                "time/step_s": done - started,
                "perf/tokens_per_s": tokens / max(done - started, 1e-9),
            }
        )
        return metrics

    def validate(self) -> dict[str, float]:
        if self.val_data is None:
            return {}
        items = [self.val_data[i] for i in range(len(self.val_data))]
        params = self.sampling_params(validation=True)
        per_rank = split_ranks(items, self.world_size)
        seeded = [
            SamplingParams(**{**vars(params), "seed": self.cfg.seed + rank})
            for rank in range(self.world_size)
        ]
        outputs = self.generate([[p.prompt_ids for p in chunk] for chunk in per_rank], seeded)
        scored_items = [
            chunk[g.prompt_index] for chunk, gens in zip(per_rank, outputs, strict=True) for g in gens
        ]
        texts = self.decode([g.token_ids for gens in outputs for g in gens])
        result = self.rewards.score(
            [
                {
                    "solution_str": t,
                    "ground_truth": i.ground_truth,
                    "data_source": i.data_source,
                    "extra_info": i.extra_info,
                }
                for i, t in zip(scored_items, texts, strict=True)
            ]
        )
        metrics = {"val/reward_mean": sum(result.scores) / max(len(result.scores), 1)}
        by_source: dict[str, list[float]] = {}
        for item, score in zip(scored_items, result.scores, strict=True):
            by_source.setdefault(item.data_source, []).append(score)
        for source, scores in by_source.items():
            metrics[f"val/{source}/reward_mean"] = sum(scores) / len(scores)
        return metrics

    def close(self, *, started_ray: bool) -> None:
        self.rewards.close()
        if self.group is not None:
            self.group.kill()
        if started_ray:
            import ray

            ray.shutdown()


def _is_due(step: int, freq: int, total: int) -> bool:
    return step == total or (freq > 0 and step % freq == 0)


def train(cfg: TrainerConfig, *, call_timeout_s: float = CALL_TIMEOUT_S) -> TrainResult:
    """Run GRPO as configured by `cfg` (from `grpo_config.load`) and return where things went.

    Resumes per `checkpoint.resume` ("auto": the latest complete checkpoint under
    `checkpoint.dir`, if any). A worker that raises or dies stops the run with `WorkerError`;
    `call_timeout_s` bounds each call on the workers."""
    wall_start = time.perf_counter()
    run = _Run(cfg, call_timeout_s=call_timeout_s)
    world = run.world_size
    cpus = (os.cpu_count() or 1) if resolve_device_kind(cfg) == "cpu" else None
    started_ray = ensure_ray(num_cpus=max(cpus, world) if cpus else None)
    log_dir = Path(cfg.logging.dir)
    logger = MetricsLogger(
        log_dir, console=cfg.logging.console, jsonl=cfg.logging.jsonl, tensorboard=cfg.logging.tensorboard
    )
    try:
        run.start_workers()
        resumed_from = run.maybe_resume()
        if cfg.val_before_train and resumed_from is None and run.val_data is not None:
            logger.log(0, run.validate())
        batches = _batches(run.sampler)
        with tqdm(total=run.total_steps, initial=run.step, desc="train", unit="step", disable=None) as bar:
            while run.step < run.total_steps:
                prompts = [run.train_data[i] for i in next(batches)]
                metrics = run.train_step(prompts)
                run.step += 1
                run.reward_history[run.step] = metrics["reward/mean"]
                if _is_due(run.step, cfg.test_freq, run.total_steps) and cfg.test_freq > 0:
                    metrics.update(run.validate())
                logger.log(run.step, metrics)
                if _is_due(run.step, cfg.checkpoint.save_freq, run.total_steps):
                    run.save()
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
