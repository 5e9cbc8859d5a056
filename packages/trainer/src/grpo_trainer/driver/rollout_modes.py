"""How a step's responses are sampled (`rollout.mode`), each mode a type behind `RolloutMode`:

The derivation: docs/INTERNALS.md, `grpo_trainer.driver.rollout_modes`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from grpo_config.schema import FilterGroupsConfig, TrainerConfig
from grpo_trainer.data import PromptItem, ResumableSampler
from grpo_trainer.driver.rounds import Round, RoundPlanner, VisionCache
from grpo_trainer.driver.sampling import groups_with_spread
from grpo_trainer.driver.scoring import Sampled, Scorer
from grpo_trainer.driver.timing import PhaseTimer
from grpo_trainer.protocols import Generation
from grpo_trainer.rollout.multi_turn import ToolLoop, Trajectory, next_turn_params
from grpo_trainer.workers.policy_workers import PolicyWorkers
from grpo_trainer.workers.rollout_workers import PendingGeneration, RolloutWorkers

NextPrompts = Callable[[], list[PromptItem]]


class RolloutMode(Protocol):
    def sample(self, step: int, next_prompts: NextPrompts, timer: PhaseTimer) -> Sampled:
        """Step `step + 1`'s scored responses (`step` updates done); `next_prompts()` draws a batch."""
        ...

    def after_update(self, step: int, timer: PhaseTimer) -> None:
        """The policy has made update `step + 1`."""
        ...

    def generate(self, round_: Round, *, step: int) -> list[list[Generation]]:
        """One round now, with the weights of `step` updates (validation)."""
        ...

    def sampler_state_in_flight(self) -> dict[str, Any] | None:
        """The data sampler's state before a generation still in flight drew its prompts, or None."""
        ...

    def prompts_in_flight(self) -> list[PromptItem]: ...

    def close(self) -> None: ...


class Colocated:
    def __init__(
        self,
        engines: PolicyWorkers,
        *,
        planner: RoundPlanner,
        scorer: Scorer,
        vision: VisionCache,
        filter_groups: FilterGroupsConfig,
        train_batch_size: int,
        tools: ToolLoop | None = None,
    ) -> None:
        self.engines = engines
        self.tools = tools
        self.planner = planner
        self.scorer = scorer
        self.vision = vision
        self.groups = filter_groups
        self.wanted = train_batch_size

    def sample(self, step: int, next_prompts: NextPrompts, timer: PhaseTimer) -> Sampled:
        """Generate and score one batch of prompts; with dynamic sampling (algorithm.filter_groups)
        drop the groups whose rewards are all equal and generate more until `data.train_batch_size`
        prompts are kept (the first ones kept), within `max_num_gen_batches` rounds."""
        groups, wanted = self.groups, self.wanted
        parts: list[Sampled] = []
        kept = dropped = generated = 0
        generated_rewards: list[torch.Tensor] = []
        for round_index in itertools.count():
            round_ = self.planner.training(next_prompts(), step=step, round_index=round_index)
            with timer("generate"):
                outputs = self.generate(round_, step=step)
            part = self.scorer.score(round_.chunks, outputs, n=round_.n, timer=timer, step=step + 1)
            if not groups.enable:
                return self.scorer.overlong_metrics(part)
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
        chosen = set(sorted(set(merged.rollout.group_ids), key=merged.rollout.group_ids.index)[:wanted])
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
        return self.scorer.overlong_metrics(result)

    def after_update(self, step: int, timer: PhaseTimer) -> None:
        with timer("weight_sync"):
            self.engines.sync_weights()

    def generate(self, round_: Round, *, step: int) -> list[list[Generation]]:
        """Wake the engines, sample every replica's chunk (with its prompts' images) and, with
        tools, every further turn, put them back to sleep."""
        engines = self.engines
        engines.rollout_wake()
        with tqdm(total=engines.world_size, desc="rollout", unit="rank", leave=False, disable=None) as bar:
            outputs = engines.generate(
                [[p.prompt_ids for p in chunk] for chunk in round_.chunks],
                round_.params,
                vision=self.vision.per_chunk(round_.chunks),
                on_done=lambda _rank: bar.update(1),
            )
        if self.tools is not None:
            outputs = self._tool_turns(round_, outputs)
        engines.rollout_sleep()
        return outputs

    def _tool_turns(self, round_: Round, outputs: list[list[Generation]]) -> list[list[Generation]]:
        """Multi-turn: the tools answer here, in the driver (so every rank of a tensor-parallel
        replica reads the same answers), and each replica samples its own responses' next turns."""
        assert self.tools is not None
        vision = self.vision.per_chunk(round_.chunks)
        budget = round_.params[0].max_tokens
        runs = [
            run
            for r, (chunk, out) in enumerate(zip(round_.chunks, outputs, strict=True))
            for run in self.tools.start(
                out, [p.prompt_ids for p in chunk], budget, group=r, vision=vision[r] if vision else None
            )
        ]

        def continue_turns(going: list[Trajectory], turn_index: int, max_tokens: int) -> list[Generation]:
            per = [[run for run in going if run.group == r] for r in range(len(round_.chunks))]
            params = [
                next_turn_params(p, turn_index=turn_index, responses=len(runs), max_tokens=max_tokens)
                for p in round_.params
            ]
            pixels = [[run.vision for run in mine] for mine in per] if vision else None
            sampled = self.engines.generate(
                [[run.prompt + run.ids for run in mine] for mine in per], params, vision=pixels
            )
            turn = {
                id(run): gen
                for mine, out in zip(per, sampled, strict=True)
                for run, gen in zip(mine, out, strict=True)
            }
            return [turn[id(run)] for run in going]

        finished = iter(self.tools.finish(runs, budget, continue_turns))
        return [[next(finished) for _ in out] for out in outputs]

    def sampler_state_in_flight(self) -> dict[str, Any] | None:
        return None

    def prompts_in_flight(self) -> list[PromptItem]:
        return []

    def close(self) -> None:
        """The engines are the policy workers': the run closes them."""


@dataclass(kw_only=True)
class _InFlight:
    round: Round
    pending: PendingGeneration
    sampler_state: dict[str, Any] | None = None  # the sampler before these prompts were drawn


class OneStepOff:
    def __init__(
        self,
        policy: PolicyWorkers,
        rollout: RolloutWorkers,
        *,
        planner: RoundPlanner,
        scorer: Scorer,
        vision: VisionCache,
        sampler: ResumableSampler,
        total_steps: int,
    ) -> None:
        self.policy = policy
        self.rollout = rollout
        self.planner = planner
        self.scorer = scorer
        self.vision = vision
        self.sampler = sampler
        self.total_steps = total_steps
        self._next: _InFlight | None = None  # the next step's generation
        self._version = 0  # policy updates behind the rollout workers' weights

    def sample(self, step: int, next_prompts: NextPrompts, timer: PhaseTimer) -> Sampled:
        """This step's responses, sampled while the previous step trained (on the first step, or
        after a validation or resume, nothing is in flight: they are sampled now); then the rollout
        workers get the current weights and start on the next step's prompts."""
        request, self._next = self._next, None
        if request is None:
            self._send_weights(step, timer)
            request = self._launch(self.planner.training(next_prompts(), step=step))
        with timer("generate_wait"):
            generated = request.pending.result()
        round_ = request.round
        sampled = self.scorer.score(round_.chunks, generated.outputs, n=round_.n, timer=timer, step=step + 1)
        sampled = self.scorer.overlong_metrics(sampled)
        sampled.metrics["rollout/staleness"] = float(step - generated.weights_version)
        sampled.metrics["timing/generate_s"] = generated.seconds
        self._send_weights(step, timer)
        if step + 1 < self.total_steps:
            sampler_state = self.sampler.state_dict()
            self._next = self._launch(self.planner.training(next_prompts(), step=step + 1))
            self._next.sampler_state = sampler_state
        return sampled

    def after_update(self, step: int, timer: PhaseTimer) -> None:
        """The weights go out before the next launch (`sample`), not here."""

    def generate(self, round_: Round, *, step: int) -> list[list[Generation]]:
        """After the generation in flight (kept for the next step), with the current weights."""
        if self._next is not None:
            self._next.pending.result()
        self._send_weights(step)
        return self._launch(round_).pending.result().outputs

    def sampler_state_in_flight(self) -> dict[str, Any] | None:
        return self._next.sampler_state if self._next is not None else None

    def prompts_in_flight(self) -> list[PromptItem]:
        return [p for chunk in self._next.round.chunks for p in chunk] if self._next is not None else []

    def close(self) -> None:
        self.rollout.close()

    def _launch(self, round_: Round) -> _InFlight:
        pending = self.rollout.start(
            [[p.prompt_ids for p in chunk] for chunk in round_.chunks],
            round_.params,
            vision=self.vision.per_chunk(round_.chunks),
        )
        return _InFlight(round=round_, pending=pending)

    def _send_weights(self, step: int, timer: PhaseTimer | None = None) -> None:
        """The policy's weights after `step` updates into the rollout workers, unless they have them
        (timed as `weight_sync` when sent)."""
        if self._version == step:
            return
        with timer("weight_sync") if timer is not None else contextlib.nullcontext():
            self.rollout.load_weights(self.policy.publish_weights(), version=step)
        self._version = step


def make_rollout_mode(
    cfg: TrainerConfig,
    policy: PolicyWorkers,
    *,
    planner: RoundPlanner,
    scorer: Scorer,
    vision: VisionCache,
    sampler: ResumableSampler,
    total_steps: int,
    tools: ToolLoop | None = None,
) -> RolloutMode:
    """The mode `rollout.mode` names; one_step_off starts its rollout workers here (each runs the
    tool loop of `rollout.multi_turn` itself; colocated, `tools` runs in the driver)."""
    if cfg.rollout.mode == "one_step_off":
        return OneStepOff(
            policy,
            RolloutWorkers(cfg),
            planner=planner,
            scorer=scorer,
            vision=vision,
            sampler=sampler,
            total_steps=total_steps,
        )
    return Colocated(
        policy,
        planner=planner,
        scorer=scorer,
        vision=vision,
        filter_groups=cfg.algorithm.filter_groups,
        train_batch_size=cfg.data.train_batch_size,
        tools=tools,
    )
