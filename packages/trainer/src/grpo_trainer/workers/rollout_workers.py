"""The driver's facade over the rollout workers of rollout.mode=one_step_off
(`rollout_worker.RolloutWorker`, one engine per rollout device): generation is started and awaited
separately, so that it runs while the training ranks update; weights arrive between rollouts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_config.schema import TrainerConfig
from grpo_trainer.devices import resolve_device_kind
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.workers.group import WorkerError
from grpo_trainer.workers.policy_workers import SHUTDOWN_TIMEOUT_S, device_worker_group
from grpo_trainer.workers.rollout_worker import RolloutWorker


@dataclass(kw_only=True)
class GenerationResult:
    outputs: list[list[Generation]]  # per worker, grouped by prompt
    weights_version: int  # policy updates behind the weights that sampled them
    seconds: float  # the slowest worker's generation time


def _check_devices(cfg: TrainerConfig, resource: str) -> None:
    """Refuse at once a cluster without a device for every training rank and rollout worker (the
    placement would otherwise wait `timeouts.setup_s` for devices that cannot come)."""
    import ray

    training = cfg.device.world_size
    rollout = cfg.rollout.worker_count
    have = int(ray.cluster_resources().get(resource, 0))
    if have < training + rollout:
        raise WorkerError(
            f"rollout.mode=one_step_off needs {training} {resource} for training (device.nnodes x "
            f"device.devices_per_node) and {rollout} more for the rollout workers (rollout.nnodes x "
            f"rollout.devices_per_node), {training + rollout} in all; the Ray cluster has {have}. Add nodes, "
            "or lower device.devices_per_node or rollout.devices_per_node."
        )


class PendingGeneration:
    """A generation the rollout workers are running; `result()` waits for it (once)."""

    def __init__(self, workers: RolloutWorkers, refs: list[Any]) -> None:
        self._workers = workers
        self._refs = refs
        self._result: GenerationResult | None = None

    def result(self) -> GenerationResult:
        if self._result is None:
            answers = self._workers.group.wait(
                self._refs,
                what="generate",
                timeout_s=self._workers.cfg.timeouts.generate_s,
                timeout_setting="timeouts.generate_s",
            )
            versions = {version for _, version, _ in answers}
            if len(versions) != 1:
                raise RuntimeError(f"rollout workers sampled with different policy versions {sorted(versions)}")
            self._result = GenerationResult(
                outputs=[generations for generations, _, _ in answers],
                weights_version=versions.pop(),
                seconds=max(seconds for _, _, seconds in answers),
            )
        return self._result


class RolloutWorkers:
    def __init__(self, cfg: TrainerConfig) -> None:
        from grpo_device import ray_resource_name

        self.cfg = cfg
        self.world_size = cfg.rollout.worker_count
        resource = ray_resource_name(resolve_device_kind(cfg))
        if resource is not None:
            _check_devices(cfg, resource)
        self.group = device_worker_group(cfg, RolloutWorker, world_size=self.world_size)
        self.group.call("setup", timeout_s=cfg.timeouts.setup_s, timeout_setting="timeouts.setup_s")

    def start(
        self,
        prompts: Sequence[Sequence[Sequence[int]]],
        params: Sequence[SamplingParams],
        *,
        vision: Sequence[Sequence[Any]] | None = None,
    ) -> PendingGeneration:
        """Worker r samples `params[r]` for `prompts[r]` (with `vision[r]`); returns at once."""
        if len(prompts) != self.world_size or len(params) != self.world_size:
            raise ValueError(f"{len(prompts)} prompt chunks / {len(params)} params for {self.world_size} rollout workers")
        per_rank = [
            ((list(chunk), param), {"vision": list(vision[r])} if vision is not None else {})
            for r, (chunk, param) in enumerate(zip(prompts, params, strict=True))
        ]
        return PendingGeneration(self, self.group.submit("generate", args_per_rank=per_rank))

    def load_weights(self, refs: list[Any], *, version: int) -> float:
        """Every worker's engine takes the weights in `refs` (`PolicyWorkers.publish_weights`);
        the slowest worker's seconds."""
        seconds = self.group.call(
            "load_weights",
            refs=refs,
            version=version,
            timeout_s=self.cfg.timeouts.weight_sync_s,
            timeout_setting="timeouts.weight_sync_s",
        )
        return max(seconds)

    def close(self) -> None:
        self.group.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S)
