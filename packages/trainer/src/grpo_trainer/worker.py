"""One data-parallel rank: the policy backend and its colocated rollout engine, in one process.

`PolicyWorker` is a plain class; `worker_group` runs it as a Ray actor. Every method that touches
the policy is called on all ranks in the same order (they hold collectives).
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
import torch
import torch.distributed as dist

from grpo_config.schema import TrainerConfig
from grpo_trainer.backends import make_backend
from grpo_trainer.protocols import Generation, PolicyBatch, SamplingParams
from grpo_trainer.rollout import make_rollout_engine
from grpo_trainer.step_batch import take_rows

log = structlog.get_logger()

COLLECTIVE_TIMEOUT_S = 600.0


def resolve_device_kind(cfg: TrainerConfig) -> str:
    from grpo_device import detect, parse_device_kind

    return str(detect() if cfg.device.kind == "auto" else parse_device_kind(cfg.device.kind))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class PolicyWorker:
    def __init__(self, cfg: TrainerConfig, *, rank: int, world_size: int, num_threads: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.num_threads = num_threads
        self.backend: Any = None
        self.engine: Any = None

    def rendezvous_address(self) -> tuple[str, int]:
        """(this node's IP, a free port): rank 0's answer is every rank's init address."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, *, master_addr: str, master_port: int) -> dict[str, Any]:
        from transformers import AutoTokenizer

        from grpo_device import comm_backend, manual_seed_all, torch_device

        torch.set_num_threads(self.num_threads)
        kind = resolve_device_kind(self.cfg)
        # torchrun's variables, for libraries that read them (Megatron); Ray shows each worker
        # exactly one device, hence LOCAL_RANK 0.
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        if self.world_size > 1:
            dist.init_process_group(
                backend=comm_backend(kind),
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
            )
        device = torch_device(kind, index=0)  # Ray exposes one accelerator per worker
        manual_seed_all(self.cfg.seed, kind=kind)  # same initial state on every rank
        self.backend = make_backend(self.cfg, device=device)
        tokenizer = AutoTokenizer.from_pretrained(self.cfg.actor.model_path)
        shared = getattr(self.backend, "module", None)
        self.engine = make_rollout_engine(self.cfg, device=device, tokenizer=tokenizer, policy_module=shared)
        log.info(
            "worker.ready",
            rank=self.rank,
            world_size=self.world_size,
            device=str(device),
            threads=self.num_threads,
            pid=os.getpid(),
        )
        dp_rank, dp_size = self._data_parallel_position()
        return {
            "rank": self.rank,
            "device": str(device),
            "pid": os.getpid(),
            "dp_rank": dp_rank,
            "dp_size": dp_size,
        }

    def _data_parallel_position(self) -> tuple[int, int]:
        """(data-parallel rank, size): ranks of one model-parallel group get the same rows."""
        if self.cfg.actor.backend == "megatron":
            from megatron.core import parallel_state

            return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        return self.rank, self.world_size

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.engine.wake_up()
        try:
            return self.engine.generate(prompts, params)
        finally:
            self.engine.sleep()

    def train(self, batch: PolicyBatch, *, num_mini_batches: int, ppo_epochs: int) -> dict[str, float]:
        """Old (and reference) log-probs for the local rows, then `ppo_epochs` passes over
        `num_mini_batches` consecutive blocks with one optimiser step each, then weight sync."""
        rows = batch.input_ids.shape[0]
        if rows % num_mini_batches:
            raise ValueError(f"{rows} local rows do not split into {num_mini_batches} mini-batches")
        clock = time.perf_counter()
        timings: dict[str, float] = {}

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[f"time/{name}_s"] = now - clock
            clock = now

        batch.old_log_probs = self.backend.log_probs(batch)["log_probs"]
        lap("old_log_prob")
        if self.cfg.actor.use_kl_loss:
            batch.ref_log_probs = self.backend.ref_log_probs(batch)
            lap("ref_log_prob")
        sums: dict[str, float] = {}
        per = rows // num_mini_batches
        updates = 0
        for _ in range(ppo_epochs):
            for m in range(num_mini_batches):
                metrics = self.backend.update(take_rows(batch, range(m * per, (m + 1) * per)))
                for name, value in metrics.items():
                    sums[name] = sums.get(name, 0.0) + value
                updates += 1
        lap("update")
        out = {f"actor/{name}": value / updates for name, value in sums.items()}
        rollout_lp = batch.extra.get("rollout_log_probs")
        if rollout_lp is not None:
            mask = batch.response_mask
            diff = ((batch.old_log_probs - rollout_lp).abs() * mask).sum() / mask.sum().clamp(min=1)
            out["rollout/logprob_abs_diff"] = float(diff)
        self.engine.update_weights(self.backend.named_weights())
        lap("weight_sync")
        return {**out, **timings}

    def save_checkpoint(
        self, step: int, *, trainer_state: dict[str, Any], dataloader_state: dict[str, Any]
    ) -> str:
        from grpo_ckpt import CheckpointManager

        ckpt = self.cfg.checkpoint
        manager = CheckpointManager(ckpt.dir, max_to_keep=ckpt.max_to_keep)
        state = self.backend.state_dict()
        contents = set(ckpt.save_contents)
        with_optimizer = "optimizer" in contents
        path = manager.save(
            step,
            model=state["model"] if "model" in contents else None,
            optimizer=state.get("optimizer") if with_optimizer else None,
            scheduler=state.get("scheduler") if with_optimizer else None,
            trainer_state=trainer_state,
            dataloader_state=dataloader_state,
            transformer_config=getattr(getattr(self.backend, "module", None), "config", None),
        )
        return str(path)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore model/optimizer/scheduler and this rank's RNG; returns the trainer and
        dataloader state saved with it."""
        from grpo_ckpt import CheckpointManager, restore_rng

        loaded = CheckpointManager(Path(path).parent).load(path)
        if loaded.model is None:
            raise ValueError(
                f"checkpoint {path} holds no model weights (checkpoint.save_contents lacked 'model')"
            )
        state: dict[str, Any] = {"model": loaded.model}
        if loaded.optimizer is not None:
            state["optimizer"] = loaded.optimizer
        if loaded.scheduler is not None:
            state["scheduler"] = loaded.scheduler
        self.backend.load_state_dict(state)
        if loaded.rng is not None:
            restore_rng(loaded.rng)
        self.engine.update_weights(self.backend.named_weights())
        return {
            "step": loaded.step,
            "trainer_state": loaded.trainer_state,
            "dataloader_state": loaded.dataloader_state,
        }

    def shutdown(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
