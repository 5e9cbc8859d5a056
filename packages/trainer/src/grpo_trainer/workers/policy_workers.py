"""The driver's typed facade over the Ray workers (`worker.PolicyWorker`, one per rank): one method
per phase of the step, typed arguments and results, each phase under its own `timeouts.*` limit.
The string RPC of the worker group (`group.py`) stays in here.

Rows reach the ranks by data-parallel position: `shards[d]` (rows of the step's batch) goes to
every rank whose data-parallel rank is d (model-parallel ranks of one group share their rows) and
per-row results come back from one rank per group, in the batch's row order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_config.replicas import RolloutReplicas
from grpo_config.schema import TrainerConfig
from grpo_trainer.batching import scatter_rows, take_rows
from grpo_trainer.devices import resolve_device_kind
from grpo_trainer.protocols import Generation, PolicyBatch, SamplingParams
from grpo_trainer.workers.group import WorkerGroup
from grpo_trainer.workers.policy_worker import PolicyWorker

SHUTDOWN_TIMEOUT_S = 60.0


def process_count(cfg: TrainerConfig) -> int:
    """Worker processes of a run: the training ranks and, with rollout.mode=one_step_off, the
    rollout workers."""
    training = cfg.device.world_size
    if cfg.rollout.mode == "one_step_off":
        return training + cfg.rollout.worker_count
    return training


def cpus_per_worker(cfg: TrainerConfig, *, resource: str | None) -> int:
    """One CPU per device worker; CPU-only workers share this machine's cores equally."""
    return max(1, (os.cpu_count() or 1) // process_count(cfg)) if resource is None else 1


def device_worker_group(cfg: TrainerConfig, worker_cls: type, *, world_size: int) -> WorkerGroup:
    """`world_size` actors of `worker_cls`, one device each (CPU: a share of the cores, as many
    torch threads), built with `cfg` under the `timeouts.setup_s` placement limit."""
    from grpo_device import ray_resource_name

    resource = ray_resource_name(resolve_device_kind(cfg))
    cpus = cpus_per_worker(cfg, resource=resource)
    return WorkerGroup(
        worker_cls,
        world_size=world_size,
        resource=resource,
        cpus_per_worker=cpus,
        ready_timeout_s=cfg.timeouts.setup_s,
        cfg=cfg,
        num_threads=cpus,
    )


@dataclass(frozen=True, kw_only=True)
class ResumedState:
    path: Path
    trainer_state: dict[str, Any]
    dataloader_state: dict[str, Any] | None


class PolicyWorkers:
    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.world_size = cfg.device.world_size
        self.replicas = RolloutReplicas.for_config(cfg)
        self._group = device_worker_group(cfg, PolicyWorker, world_size=self.world_size)
        addr, port = self._group.call_rank(
            0, "rendezvous_address", timeout_s=cfg.timeouts.setup_s, timeout_setting="timeouts.setup_s"
        )
        ready = self._call("setup", "setup_s", master_addr=addr, master_port=port)
        self.dp_size: int = ready[0]["dp_size"]
        self.dp_rank_of: list[int] = [info["dp_rank"] for info in ready]  # by worker rank

    def _call(
        self,
        method: str,
        timeout: str,
        *,
        args_per_rank: Sequence[tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
        on_done: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        return self._group.call(
            method,
            args_per_rank=args_per_rank,
            timeout_s=getattr(self.cfg.timeouts, timeout),
            timeout_setting=f"timeouts.{timeout}",
            on_done=on_done,
            **kwargs,
        )

    def _per_dp_rank(self, batch: PolicyBatch, shards: Sequence[Sequence[int]]) -> list[tuple[tuple[Any, ...], dict]]:
        """Each data-parallel group's rows, stored once in Ray's object store, as per-rank args."""
        import ray

        if len(shards) != self.dp_size:
            raise ValueError(f"{len(shards)} row shards for {self.dp_size} data-parallel ranks")
        refs = [ray.put(take_rows(batch, rows)) for rows in shards]
        return [((refs[d],), {}) for d in self.dp_rank_of]

    def _one_per_dp_rank(self, results: list[Any]) -> list[Any]:
        first: dict[int, Any] = {}
        for rank, dp_rank in enumerate(self.dp_rank_of):
            first.setdefault(dp_rank, results[rank])
        return [first[d] for d in range(self.dp_size)]

    # -- rollout ----------------------------------------------------------------------------------
    def rollout_wake(self) -> None:
        self._call("rollout_wake", "wake_sleep_s")

    def rollout_sleep(self) -> None:
        self._call("rollout_sleep", "wake_sleep_s")

    def generate(
        self,
        prompts: Sequence[Sequence[Sequence[int]]],
        params: Sequence[SamplingParams],
        *,
        vision: Sequence[Sequence[Any]] | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[list[Generation]]:
        """Replica r samples `params[r]` for `prompts[r]` (every rank of the replica gets the same
        request: each runs its shard of the engine), with `vision[r]`, its prompts' pixel inputs,
        when given; generations per replica, grouped by prompt, read from the replica's first rank."""
        replicas = self.replicas
        if len(prompts) != replicas.count or len(params) != replicas.count:
            raise ValueError(f"{len(prompts)} prompt chunks / {len(params)} params for {replicas.count} replicas")
        per_rank = []
        for rank in range(self.world_size):
            replica = replicas.replica_of(rank)
            kwargs = {"vision": list(vision[replica])} if vision is not None else {}
            per_rank.append(((list(prompts[replica]), params[replica]), kwargs))
        results = self._call("generate", "generate_s", args_per_rank=per_rank, on_done=on_done)
        return [results[replicas.leader(r)] for r in range(replicas.count)]

    def sync_weights(self) -> None:
        self._call("sync_weights", "weight_sync_s")

    def publish_weights(self) -> list[Any]:
        """The policy's weights in Ray's object store (rollout.mode=one_step_off): the references,
        bucket by bucket."""
        return self._call("publish_weights", "weight_sync_s")[0]

    # -- policy -----------------------------------------------------------------------------------
    def log_probs(self, batch: PolicyBatch, shards: Sequence[Sequence[int]], *, ref: bool = False) -> torch.Tensor:
        """[B, T] log-probs of `batch` under the policy (or, with `ref`, the reference)."""
        results = self._call("log_probs", "log_probs_s", args_per_rank=self._per_dp_rank(batch, shards), ref=ref)
        rows, width = batch.input_ids.shape
        parts = list(zip(shards, self._one_per_dp_rank(results), strict=True))
        return scatter_rows(parts, num_rows=rows, width=width)

    def update(
        self, batch: PolicyBatch, shards: Sequence[Sequence[int]], *, num_mini_batches: int, ppo_epochs: int
    ) -> dict[str, float]:
        """`ppo_epochs` x `num_mini_batches` optimizer steps; the metrics (the same on every rank)."""
        results = self._call(
            "update",
            "update_s",
            args_per_rank=self._per_dp_rank(batch, shards),
            num_mini_batches=num_mini_batches,
            ppo_epochs=ppo_epochs,
        )
        return results[0]

    # -- checkpoints ------------------------------------------------------------------------------
    def save(self, step: int, *, trainer_state: dict[str, Any], dataloader_state: dict[str, Any]) -> Path:
        paths = self._call(
            "save_checkpoint",
            "checkpoint_s",
            step=step,
            trainer_state=trainer_state,
            dataloader_state=dataloader_state,
        )
        return Path(paths[0])

    def load(self, path: Path) -> ResumedState:
        state = self._call("load_checkpoint", "checkpoint_s", path=str(path))[0]
        return ResumedState(
            path=path, trainer_state=state["trainer_state"], dataloader_state=state["dataloader_state"]
        )

    def export_checkpoint_hf(self, step_dir: Path) -> None:
        """The HF export of a saved step under `<step_dir>/huggingface/`, recorded in its manifest
        (as a save with checkpoint.export_hf does)."""
        self._call("export_checkpoint_hf", "checkpoint_s", path=str(step_dir))

    def close(self) -> None:
        """Ask every rank to shut down (engines release shared and device memory), then kill the
        actors; a rank that cannot answer is killed anyway."""
        self._group.shutdown(timeout_s=SHUTDOWN_TIMEOUT_S)
