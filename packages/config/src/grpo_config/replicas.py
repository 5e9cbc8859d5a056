"""Where the rollout engines run: `rollout.tensor_parallel_size = k` over a world of W training
ranks gives W / k replicas, replica r on the k consecutive ranks r*k .. r*k + k - 1.

Each replica is one vLLM engine whose k tensor-parallel shards live inside the k training
processes themselves (vLLM's `external_launcher` executor, verl's hybrid-engine layout): no extra
processes, no extra devices, and the engine shares each rank's device with the policy, which is
what sleep mode and offload are for. Consecutive ranks keep a replica on one node, so its
tensor-parallel traffic stays on the node's fast links; the driver spreads prompts over the
replicas and reads each replica's results from its first rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_config.schema import TrainerConfig


@dataclass(frozen=True)
class RolloutReplicas:
    world_size: int
    tensor_parallel_size: int

    def __post_init__(self) -> None:
        k, world = self.tensor_parallel_size, self.world_size
        if k < 1 or world < 1 or world % k:
            raise ValueError(
                f"rollout.tensor_parallel_size={k} must divide the world size {world} "
                "(device.nnodes * device.devices_per_node)"
            )

    @classmethod
    def for_config(cls, cfg: TrainerConfig) -> RolloutReplicas:
        """The layout `train()` uses; the `hf` engine is one replica per rank (validation refuses
        a tensor-parallel size with it). With rollout.mode=one_step_off the replicas are the
        rollout workers, one per rollout device."""
        if cfg.rollout.mode == "one_step_off":
            return cls(world_size=cfg.rollout.worker_count, tensor_parallel_size=1)
        k = cfg.rollout.tensor_parallel_size if cfg.rollout.engine == "vllm" else 1
        return cls(world_size=cfg.device.world_size, tensor_parallel_size=k)

    @property
    def count(self) -> int:
        return self.world_size // self.tensor_parallel_size

    def replica_of(self, rank: int) -> int:
        return rank // self.tensor_parallel_size

    def ranks_of(self, replica: int) -> range:
        first = replica * self.tensor_parallel_size
        return range(first, first + self.tensor_parallel_size)

    def leader(self, replica: int) -> int:
        """The rank whose results stand for the replica (every rank of it returns the same)."""
        return replica * self.tensor_parallel_size

    def describe(self) -> list[str]:
        """['0-3', '4-7'] for 8 ranks in replicas of 4 ('0' for one rank)."""
        return [
            f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) for r in map(self.ranks_of, range(self.count))
        ]
