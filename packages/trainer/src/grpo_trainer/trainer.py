"""The GRPO loop. One step, top to bottom, as the algorithm reads (`_Run.train_step`):

    generate -> reward (-> overlong shaping; dynamic sampling: drop equal-reward groups, generate
    more) -> old log-probs -> ref log-probs (-> KL penalty in the reward) -> advantages -> loss mask
    and weights (overlong filtering, rollout correction) -> update (ppo_epochs x mini-batches) ->
    weight sync -> metrics; then validation and checkpoint when due.

The driver (this process) holds data, rewards, advantages and metrics; the policy and its rollout
engine live in Ray worker actors, reached through the typed facade `policy_workers.PolicyWorkers`.
Each phase's wall time is logged as `timing/<phase>_s` (as verl's `timing_s/*`).

With rollout.mode=one_step_off the engines are rollout workers of their own
(`rollout_workers.RolloutWorkers`) and a step reads (`_Run.sample_one_step_off`):

    wait for this step's responses (sampled by the policy one update behind) -> send the current
    weights to the rollout workers -> start generating the next step's responses -> score, train
    and update on this step's while they generate.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
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
from grpo_trainer import grpo_math
from grpo_trainer.batching import dp_row_split, pad_rows, response_budget
from grpo_trainer.data import PromptDataset, PromptItem, ResumableSampler
from grpo_trainer.data.images import load_processor
from grpo_trainer.devices import resolve_device_kind
from grpo_trainer.metrics import MetricsLogger, WandbRun, pick_val_generations, plot_metrics
from grpo_trainer.policy_workers import PolicyWorkers, process_count
from grpo_trainer.protocols import Generation, PolicyBatch, SamplingParams
from grpo_trainer.resume_layout import LAYOUT_KEY, check_resume_layout, checkpoint_layout, layout_change
from grpo_trainer.reward_shaping import KLController, kl_reward_penalty, overlong_penalty
from grpo_trainer.rewards import RewardManager, RewardResult
from grpo_trainer.rewards.manager import AllRewardsFailedError
from grpo_trainer.rollout_correction import RolloutCorrection, mismatch_metrics
from grpo_trainer.rollout_step import (
    Rollout,
    gather_rollout,
    groups_with_spread,
    reward_items,
    rollout_metrics,
    seeded_per_rank,
    split_ranks,
    step_seed,
)
from grpo_trainer.rollout_workers import PendingGeneration, RolloutWorkers
from grpo_trainer.vision import VisionInputs, pixel_inputs
from grpo_trainer.worker import HF_EXPORT_DIR
from grpo_trainer.worker_group import ensure_ray, shutdown_ray

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


class PhaseTimer:
    """`with timer("update"): ...` records `timing/update_s`."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing/{phase}_s"  # summed over the rounds of dynamic sampling
            self.metrics[key] = self.metrics.get(key, 0.0) + time.perf_counter() - started


@dataclass(kw_only=True)
class Sampled:
    """A step's responses with their scores (the reward function's) and rewards (after overlong
    shaping), [B] each, and the sampling metrics."""

    rollout: Rollout
    scored: RewardResult
    scores: torch.Tensor
    rewards: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)

    def take(self, indices: Sequence[int]) -> Sampled:
        index = torch.tensor(list(indices), dtype=torch.long)
        return Sampled(
            rollout=self.rollout.take(indices),
            scored=self.scored,
            scores=self.scores.index_select(0, index),
            rewards=self.rewards.index_select(0, index),
            metrics=dict(self.metrics),
        )

    @classmethod
    def concat(cls, parts: Sequence[Sampled]) -> Sampled:
        scored = RewardResult(
            scores=[x for p in parts for x in p.scores.tolist()],
            n_errors=sum(p.scored.n_errors for p in parts),
            n_timeouts=sum(p.scored.n_timeouts for p in parts),
            n_unknown_source=sum(p.scored.n_unknown_source for p in parts),
        )
        return cls(
            rollout=Rollout.concat([p.rollout for p in parts]),
            scored=scored,
            scores=torch.cat([p.scores for p in parts]),
            rewards=torch.cat([p.rewards for p in parts]),
        )


@dataclass(kw_only=True)
class RoundRequest:
    """One generation round: its prompts per replica and their sampling settings (one per replica,
    seeded), and, while rollout workers of their own run it, their pending call."""

    chunks: list[list[PromptItem]]
    params: list[SamplingParams]
    pending: PendingGeneration | None = None
    sampler_state: dict[str, Any] | None = None  # the sampler before these prompts were drawn


# data.truncation -> PromptDataset's overlong mode (used when data.filter_overlong_prompts=false).
_TRUNCATION = {"error": "error", "left": "truncate_left", "right": "truncate_right"}


def _batches(sampler: ResumableSampler) -> Iterator[list[int]]:
    while True:
        yield from sampler


class _Run:
    """State of one `train` call; its methods are the loop's phases."""

    def __init__(self, cfg: TrainerConfig) -> None:
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.world_size = cfg.device.nnodes * cfg.device.devices_per_node
        self.replicas = RolloutReplicas.for_config(cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(
            cfg.actor.model_path, trust_remote_code=cfg.actor.trust_remote_code
        )
        data = cfg.data
        self.processor = load_processor(cfg.actor.model_path, trust_remote_code=cfg.actor.trust_remote_code)
        dataset_args = {
            "prompt_key": data.prompt_key,
            "max_prompt_length": data.max_prompt_length,
            "overlong": "filter" if data.filter_overlong_prompts else _TRUNCATION[data.truncation],
            "apply_chat_template": data.apply_chat_template,
            "processor": self.processor,
        }
        if not data.train_files:
            raise ValueError("data.train_files is empty: give at least one parquet/jsonl file")
        self.train_data = PromptDataset(data.train_files, self.tokenizer, **dataset_args)
        self.val_data = (
            PromptDataset(data.val_files, self.tokenizer, **dataset_args) if data.val_files else None
        )
        self.sampler = ResumableSampler(
            len(self.train_data),
            batch_size=data.gen_batch_size or data.train_batch_size,
            seed=data.seed,
            shuffle=data.shuffle,
        )
        self.kl_controller = KLController(cfg.algorithm.kl_ctrl)
        self._vision: dict[tuple[int, tuple[bytes, ...]], VisionInputs | None] = {}
        self.correction = RolloutCorrection(cfg.algorithm.rollout_correction)
        self.total_steps = cfg.total_training_steps or cfg.total_epochs * len(self.sampler)
        self.rewards = RewardManager(
            cfg.reward.timeout_s, cfg.reward.custom_fn, num_workers=cfg.reward.num_workers, grader=cfg.reward.grader
        )
        self.max_tokens = response_budget(cfg)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.workers: PolicyWorkers | None = None
        self.rollout_workers: RolloutWorkers | None = None  # rollout.mode=one_step_off
        self.next_round: RoundRequest | None = None  # one_step_off: the next step's generation in flight
        self.rollout_version = 0  # one_step_off: policy updates behind the rollout workers' weights
        self.step = 0
        self.reward_history: dict[int, float] = {}
        self.resumed_metrics: dict[str, float] | None = None  # the resumed checkpoint's step record
        self.zero_advantage_steps = 0  # steps in a row whose advantages were all zero
        self.last_advantages: torch.Tensor | None = None

    def start_workers(self) -> PolicyWorkers:
        self.workers = PolicyWorkers(self.cfg)
        if self.cfg.rollout.mode == "one_step_off":
            self.rollout_workers = RolloutWorkers(self.cfg)
        return self.workers

    # -- the step ---------------------------------------------------------------------------------
    def train_step(self, next_prompts: Callable[[], list[PromptItem]]) -> dict[str, float]:
        """One GRPO step on `next_prompts()` (called again for each further generation round of
        dynamic sampling)."""
        cfg, workers, timer = self.cfg, self._workers(), PhaseTimer()
        started = time.perf_counter()

        sampled = self.sample_one_step_off(next_prompts, timer) if self.rollout_workers else self.sample(next_prompts, timer)
        rollout = sampled.rollout
        batch = pad_rows(
            [item.prompt_ids for item in rollout.items],
            [g.token_ids for g in rollout.generations],
            pad_token_id=self.pad_token_id,
            rollout_log_probs=[g.logprobs for g in rollout.generations],
        )
        if any(item.images for item in rollout.items):
            batch.vision = [self.vision_of(item) for item in rollout.items]
        self._forget_vision()
        num_mini_batches = cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size
        shards = dp_row_split(len(rollout.generations), num_mini_batches=num_mini_batches, dp_size=workers.dp_size)

        bypass = cfg.algorithm.rollout_correction.bypass_mode
        if bypass:  # the engine's log-probs are the old policy's (zeros off the responses, as pad_rows')
            batch.old_log_probs = batch.extra["rollout_log_probs"]
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

        rollout_log_probs = batch.extra["rollout_log_probs"]
        positions = batch.response_mask  # every response token (the loss mask may lose some next)
        metrics.update(self.correct(batch, rollout))

        with timer("update"):
            update = workers.update(batch, shards, num_mini_batches=num_mini_batches, ppo_epochs=cfg.actor.ppo_epochs)

        if self.rollout_workers is None:  # one_step_off sends the weights before the next generation
            with timer("weight_sync"):
                workers.sync_weights()

        metrics.update(
            rollout_metrics(
                rollout, rewards=sampled.scores, advantages=batch.advantages, scored=sampled.scored
            )
        )
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

    def sample(self, next_prompts: Callable[[], list[PromptItem]], timer: PhaseTimer) -> Sampled:
        """Generate and score one batch of prompts; with dynamic sampling (algorithm.filter_groups)
        drop the groups whose rewards are all equal and generate more until `data.train_batch_size`
        prompts are kept (the first ones kept), within `max_num_gen_batches` rounds."""
        cfg = self.cfg
        groups = cfg.algorithm.filter_groups
        wanted = cfg.data.train_batch_size
        parts: list[Sampled] = []
        kept = dropped = generated = 0
        generated_rewards: list[torch.Tensor] = []
        for round_index in itertools.count():
            part = self.sample_round(next_prompts(), round_index, timer)
            if not groups.enable:
                return self._overlong_metrics(part)
            generated_rewards.append(part.scores)
            values = part.scores if groups.metric in ("acc", "score") else part.rewards
            keep = set(groups_with_spread(values.tolist(), part.rollout.group_ids))
            total = len(set(part.rollout.group_ids))
            generated += total
            dropped += total - len(keep)
            kept += len(keep)
            parts.append(part.take([i for i, g in enumerate(part.rollout.group_ids) if g in keep]))
            if kept >= wanted:
                break
            limit = groups.max_num_gen_batches
            if limit > 0 and round_index + 1 >= limit:
                raise RuntimeError(
                    f"dynamic sampling kept {kept} of the {wanted} prompts a step needs after "
                    f"{round_index + 1} generation rounds (algorithm.filter_groups.max_num_gen_batches="
                    f"{limit}); {dropped} of {generated} groups had equal rewards for every response. The "
                    "prompts may be too easy or too hard for the policy: raise max_num_gen_batches (0: no "
                    "limit), data.gen_batch_size, or rollout.n."
                )
        merged = Sampled.concat(parts)
        first_groups = sorted(set(merged.rollout.group_ids), key=merged.rollout.group_ids.index)[:wanted]
        chosen = set(first_groups)
        result = merged.take([i for i, g in enumerate(merged.rollout.group_ids) if g in chosen])
        result.metrics.update(
            {
                "train/num_gen_batches": float(round_index + 1),
                "dynamic_sampling/groups_generated": float(generated),
                "dynamic_sampling/groups_dropped": float(dropped),
                "dynamic_sampling/groups_kept_unused": float(kept - wanted),
                "dynamic_sampling/reward_mean_generated": float(torch.cat(generated_rewards).mean()),
            }
        )
        return self._overlong_metrics(result)

    def sample_one_step_off(self, next_prompts: Callable[[], list[PromptItem]], timer: PhaseTimer) -> Sampled:
        """This step's responses, sampled by the rollout workers while the previous step trained
        (here, and after a validation or resume, nothing is in flight: they are sampled now); then
        the rollout workers get the current weights and start on the next step's prompts."""
        request, self.next_round = self.next_round, None
        if request is None:  # the first step, or after a resume: nothing in flight
            self.send_weights(timer)
            request = self.launch(self.round_request(next_prompts(), step=self.step))
        with timer("generate_wait"):
            generated = self._pending(request).result()
        sampled = self._overlong_metrics(self.score(request.chunks, generated.outputs, n=request.params[0].n, timer=timer))
        sampled.metrics["rollout/staleness"] = float(self.step - generated.weights_version)
        sampled.metrics["timing/generate_s"] = generated.seconds
        self.send_weights(timer)
        if self.step + 1 < self.total_steps:
            sampler_state = self.sampler.state_dict()
            self.next_round = self.launch(self.round_request(next_prompts(), step=self.step + 1))
            self.next_round.sampler_state = sampler_state
        return sampled

    def round_request(self, prompts: list[PromptItem], *, step: int, round_index: int = 0) -> RoundRequest:
        chunks = split_ranks(prompts, self.replicas.count)
        params = self.sampling_params(validation=False)
        seeds = [step_seed(self.cfg.seed, step, replica, round_index) for replica in range(self.replicas.count)]
        return RoundRequest(chunks=chunks, params=seeded_per_rank(params, seeds))

    def launch(self, request: RoundRequest) -> RoundRequest:
        """Start `request` on the rollout workers (one_step_off) and return at once."""
        vision = [[self.vision_of(p) for p in chunk] for chunk in request.chunks]
        request.pending = self._rollout_workers().start(
            [[p.prompt_ids for p in chunk] for chunk in request.chunks],
            request.params,
            vision=vision if any(v is not None for chunk in vision for v in chunk) else None,
        )
        return request

    @staticmethod
    def _pending(request: RoundRequest) -> PendingGeneration:
        if request.pending is None:
            raise RuntimeError("the generation round was not launched")
        return request.pending

    def send_weights(self, timer: PhaseTimer | None = None) -> None:
        """The policy's current weights into the rollout workers, unless they have them already
        (timed as `weight_sync` when sent)."""
        if self.rollout_version == self.step:
            return
        with timer("weight_sync") if timer is not None else contextlib.nullcontext():
            refs = self._workers().publish_weights()
            self._rollout_workers().load_weights(refs, version=self.step)
        self.rollout_version = self.step

    def _rollout_workers(self) -> RolloutWorkers:
        if self.rollout_workers is None:
            raise RuntimeError("no rollout workers of their own: rollout.mode is not one_step_off")
        return self.rollout_workers

    def sample_round(self, prompts: list[PromptItem], round_index: int, timer: PhaseTimer) -> Sampled:
        request = self.round_request(prompts, step=self.step, round_index=round_index)
        with timer("generate"):
            outputs = self.generate(request.chunks, request.params)
        return self.score(request.chunks, outputs, n=request.params[0].n, timer=timer)

    def score(
        self, chunks: list[list[PromptItem]], outputs: list[list[Generation]], *, n: int, timer: PhaseTimer
    ) -> Sampled:
        """A round's generations in prompt order with their scores and (overlong-shaped) rewards."""
        cfg = self.cfg
        rollout = gather_rollout(chunks, outputs, n=n)
        with timer("reward"):
            texts = self.decode([g.token_ids for g in rollout.generations])
            scored = self.rewards.score(reward_items(rollout.items, texts))
        if scored.all_failed:
            raise AllRewardsFailedError(self._reward_failure(scored))
        scores = torch.tensor(scored.scores, dtype=torch.float64)
        rewards = scores
        buffer = cfg.reward.overlong_buffer
        if buffer.enable:
            lengths = torch.tensor([len(g.token_ids) for g in rollout.generations])
            rewards = scores + overlong_penalty(
                lengths,
                budget=buffer.max_response_length or self.max_tokens,
                buffer_len=buffer.len,
                penalty_factor=buffer.penalty_factor,
            )
        return Sampled(rollout=rollout, scored=scored, scores=scores, rewards=rewards)

    def _reward_failure(self, scored: RewardResult) -> str:
        reward = self.cfg.reward
        fix = (
            f"fix reward.custom_fn ({reward.custom_fn})"
            if reward.custom_fn
            else "set reward.custom_fn, or give the rows a data_source that has a reward function"
        )
        if scored.n_timeouts:
            fix += f", or raise reward.timeout_s ({reward.timeout_s:g} s for the whole batch)"
        return (
            f"every reward call of step {self.step + 1} failed ({scored.n_errors} raised, {scored.n_timeouts} "
            f"timed out, {scored.n_unknown_source} had no reward function of {len(scored.scores)}); the "
            f"first: {scored.first_failure}. Training on these scores (all 0) would learn nothing: {fix}."
        )

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

    def _overlong_metrics(self, sampled: Sampled) -> Sampled:
        """The overlong penalty's mean and the share penalised over the step's batch, when
        `reward.overlong_buffer.log` asks for them."""
        buffer = self.cfg.reward.overlong_buffer
        if buffer.enable and buffer.log:
            penalty = sampled.rewards - sampled.scores
            sampled.metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
            sampled.metrics["reward/overlong_fraction"] = float((penalty < 0).double().mean())
        return sampled

    def correct(self, batch: PolicyBatch, rollout: Rollout) -> dict[str, float]:
        """The loss mask and weights of the update: rollout correction (on every response, so its
        statistics are verl's), then overlong filtering."""
        metrics: dict[str, float] = {}
        if self.correction.enabled:
            assert batch.old_log_probs is not None
            fix = self.correction.apply(batch.old_log_probs, batch.extra["rollout_log_probs"], batch.response_mask)
            batch.response_mask = fix.response_mask
            batch.rollout_is_weights = fix.is_weights
            metrics.update(fix.metrics)
        if self.cfg.algorithm.overlong_filter:
            cut = torch.tensor([g.finish_reason == "length" for g in rollout.generations])
            batch.response_mask = batch.response_mask * (~cut).to(batch.response_mask.dtype).unsqueeze(-1)
            metrics["rollout/overlong_filtered_fraction"] = float(cut.double().mean())
        return metrics

    def generate(
        self, chunks: list[list[PromptItem]], params: list[SamplingParams]
    ) -> list[list[Generation]]:
        """Wake the rollout engines, sample every replica's chunk (with its prompts' images), put
        the engines back to sleep. With rollout workers of their own (validation): after the
        generation in flight, with the current weights."""
        if self.rollout_workers is not None:
            if self.next_round is not None:
                self._pending(self.next_round).result()  # kept for the next step
            self.send_weights()
            return self._pending(self.launch(RoundRequest(chunks=chunks, params=list(params)))).result().outputs
        workers = self._workers()
        vision = [[self.vision_of(p) for p in chunk] for chunk in chunks]
        workers.rollout_wake()
        with tqdm(total=self.world_size, desc="rollout", unit="rank", leave=False, disable=None) as bar:
            outputs = workers.generate(
                [[p.prompt_ids for p in chunk] for chunk in chunks],
                params,
                vision=vision if any(v is not None for chunk in vision for v in chunk) else None,
                on_done=lambda _rank: bar.update(1),
            )
        workers.rollout_sleep()
        return outputs

    def _forget_vision(self) -> None:
        """Pixel inputs are built once per prompt per step: drop this step's, keep those of the
        next step's generation in flight (one_step_off)."""
        ahead = self.next_round.chunks if self.next_round is not None else []
        keep = {(p.index, p.images) for chunk in ahead for p in chunk}
        self._vision = {key: value for key, value in self._vision.items() if key in keep}

    def vision_of(self, item: PromptItem) -> VisionInputs | None:
        """A prompt's pixel inputs, built once per prompt by the model's image processor (kept for
        the step's training batch); None for a text prompt."""
        if not item.images:
            return None
        key = (item.index, item.images)
        if key not in self._vision:
            self._vision[key] = pixel_inputs(self.processor.image_processor, item.images)
        return self._vision[key]

    def advantages(self, rewards: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
        """The per-response advantage of `algorithm.adv_estimator`: GRPO's (as `norm_adv_by_std` /
        `adv_eps` say) or RLOO's leave-one-out one."""
        algorithm = self.cfg.algorithm
        if algorithm.adv_estimator == "rloo":
            return grpo_math.rloo_advantages(rewards, group_ids)
        return grpo_math.group_advantages(
            rewards, group_ids, norm_by_std=algorithm.norm_adv_by_std, eps=algorithm.adv_eps
        )

    def sampling_params(self, *, validation: bool) -> SamplingParams:
        """Training: rollout.n/temperature/top_p/top_k. Validation as verl's val_kwargs: greedy and one
        response a prompt unless rollout.val_do_sample, then the val_* settings."""
        r = self.cfg.rollout
        if not validation:
            return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=self.max_tokens)
        if not r.val_do_sample:
            return SamplingParams(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=self.max_tokens)
        return SamplingParams(
            n=r.val_n, temperature=r.val_temperature, top_p=r.val_top_p, top_k=r.val_top_k, max_tokens=self.max_tokens
        )

    def decode(self, token_ids: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)

    def validate(self) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
        """The validation set's mean reward (overall and per data source) and the samples
        `logging.val_generations` asks to log (prompt, response, score)."""
        if self.val_data is None:
            return {}, []
        items = [self.val_data[i] for i in range(len(self.val_data))]
        params = self.sampling_params(validation=True)
        chunks = split_ranks(items, self.replicas.count)
        seeds = [self.cfg.seed + replica for replica in range(self.replicas.count)]
        rollout = gather_rollout(chunks, self.generate(chunks, seeded_per_rank(params, seeds)), n=params.n)
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
        in_flight = self.next_round.sampler_state if self.next_round is not None else None
        return self._workers().save(
            self.step,
            trainer_state=trainer_state,
            dataloader_state=in_flight if in_flight is not None else self.sampler.state_dict(),
        )

    def _workers(self) -> PolicyWorkers:
        if self.workers is None:
            raise RuntimeError("workers are not started")
        return self.workers

    def close(self, *, started_ray: bool) -> None:
        self.rewards.close()
        if self.rollout_workers is not None:
            self.rollout_workers.close()
        if self.workers is not None:
            self.workers.close()
        if started_ray:
            shutdown_ray()


def run_dir(cfg: TrainerConfig) -> Path:
    """Where a run's metrics.jsonl and metrics.png go: `<logging.dir>/<project_name>/<experiment_name>`
    (TensorBoard's events under `<logging.dir>/tensorboard/` in the same two folders, so one
    TensorBoard over `<logging.dir>/tensorboard` shows each experiment as its own run)."""
    return Path(cfg.logging.dir) / cfg.project_name / cfg.experiment_name


class TargetStepPassedError(ValueError):
    """The checkpoint to resume is past the run's last step."""


def check_target_step(step_dir: Path, *, total_steps: int) -> None:
    """Refuse to resume a checkpoint past the run's last step (a run cannot train backwards)."""
    step = int(json.loads((step_dir / "trainer_state.json").read_text())["global_step"])
    if step > total_steps:
        raise TargetStepPassedError(
            f"checkpoint.resume found {step_dir} at step {step}, past this run's last step {total_steps} "
            f"(total_training_steps, else total_epochs x steps per epoch): there is nothing to train. Raise "
            f"total_training_steps above {step} to train on, or start the run in another folder."
        )


class ModelPathError(ValueError):
    """actor.model_path names a local directory that is not a Hugging Face model."""


def check_model_path(model_path: str) -> None:
    """Refuse a local `model_path` that is not a model directory before anything is loaded (a hub id,
    `org/name`, is left to transformers)."""
    path = Path(model_path).expanduser()
    local = path.is_absolute() or model_path.startswith((".", "~")) or path.exists()
    if not local or (path / "config.json").is_file():
        return
    what = "does not exist" if not path.exists() else "has no config.json (it is not a Hugging Face model directory)"
    raise ModelPathError(
        f"actor.model_path={model_path}: {path} {what}. Point actor.model_path (MODEL_PATH for the "
        "launchers) at a downloaded model, e.g. `hf download <org>/<model> --local-dir <dir>`."
    )


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
        batches = _batches(run.sampler)
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
