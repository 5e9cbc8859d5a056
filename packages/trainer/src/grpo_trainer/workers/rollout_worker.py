"""A rollout worker of its own (rollout.mode=one_step_off): one engine on one device, no policy.

It generates while the training ranks update, and takes their weights between rollouts: the
training rank 0 puts the policy's HF-named tensors into Ray's object store in buckets
(`publish_weights`, called in the training worker) and each rollout worker reads them one bucket at
a time into its engine (`RolloutWorker.load_weights`), so neither side holds more than the model
once plus a bucket. The transfer goes through host memory (and the network between nodes); a
device-to-device broadcast is not implemented.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import structlog
import torch

from grpo_config.schema import TrainerConfig
from grpo_trainer.devices import resolve_device_kind
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rollout import make_rollout_engine
from grpo_trainer.rollout.multi_turn import MultiTurnEngine, tool_loop
from grpo_trainer.rollout.vllm_weight_buckets import iter_buckets

log = structlog.get_logger()


def publish_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], *, bucket_mb: int, keep: bool) -> list[Any]:
    """Every tensor of `named_tensors` (all of them are read: on Megatron the iteration holds
    collectives every rank must join), copied to host memory and put in Ray's object store in
    buckets of at most `bucket_mb` MB when `keep` (one rank does), in order: the references."""
    import ray

    refs: list[Any] = []
    for bucket in iter_buckets(named_tensors, bucket_bytes=bucket_mb * 2**20):
        if keep:
            refs.append(ray.put([(name, tensor.detach().to("cpu", copy=True)) for name, tensor in bucket]))
    return refs


def _read_buckets(refs: list[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    import ray

    for ref in refs:
        yield from ray.get(ref)


class RolloutWorker:
    def __init__(self, cfg: TrainerConfig, *, rank: int, world_size: int, num_threads: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.num_threads = num_threads
        self.engine: Any = None
        self.weights_version = 0  # updates of the policy behind the engine's weights

    def setup(self) -> dict[str, Any]:
        from transformers import AutoTokenizer

        from grpo_device import manual_seed_all, torch_device

        torch.set_num_threads(self.num_threads)
        kind = resolve_device_kind(self.cfg)
        device = torch_device(kind, index=0)  # Ray exposes one device per worker
        manual_seed_all(self.cfg.seed, kind=kind)
        tokenizer = AutoTokenizer.from_pretrained(
            self.cfg.actor.model_path, trust_remote_code=self.cfg.actor.trust_remote_code
        )
        # A copy of the checkpoint the policy starts from: the same weights until the first load.
        self.engine = make_rollout_engine(self.cfg, device=device, tokenizer=tokenizer)
        loop = tool_loop(self.cfg, tokenizer)  # one engine on one device: the worker runs the tools itself
        if loop is not None:
            self.engine = MultiTurnEngine(self.engine, loop)
        log.info("rollout_worker.ready", rank=self.rank, device=str(device), threads=self.num_threads, pid=os.getpid())
        return {"rank": self.rank, "device": str(device), "pid": os.getpid()}

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, vision: list | None = None
    ) -> tuple[list[Generation], int, float]:
        """The generations, the policy version they were sampled with and the seconds they took."""
        started = time.perf_counter()
        generations = self.engine.generate(prompts, params, vision=vision)
        return generations, self.weights_version, time.perf_counter() - started

    def load_weights(self, refs: list[Any], *, version: int) -> float:
        """The policy's weights after `version` updates, from the object store; the seconds it took."""
        started = time.perf_counter()
        self.engine.update_weights(_read_buckets(refs))
        self.weights_version = version
        return time.perf_counter() - started

    def shutdown(self) -> None:
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        self.engine = None
