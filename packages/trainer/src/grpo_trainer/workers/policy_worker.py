"""One rank: the policy (`Actor` over a backend) and, with rollout.mode=sync, its colocated rollout
engine, in one process (with one_step_off the engines are `rollout_worker.RolloutWorker`s).

`PolicyWorker` is a plain class; `group.WorkerGroup` runs it as a Ray actor and `policy_workers` is the
driver's typed facade over it: one method here per phase of the step. Every method that touches
the policy is called on all ranks in the same order (they hold collectives).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
import torch
import torch.distributed as dist

from grpo_config.schema import TrainerConfig
from grpo_trainer.backends import make_backend
from grpo_trainer.devices import resolve_device_kind
from grpo_trainer.protocols import Generation, PolicyBatch, SamplingParams
from grpo_trainer.rollout import make_rollout_engine
from grpo_trainer.workers.actor import Actor
from grpo_trainer.workers.actor_checkpoint import load_actor, save_actor
from grpo_trainer.workers.rollout_memory import RolloutMemory
from grpo_trainer.workers.rollout_worker import publish_weights

log = structlog.get_logger()

# A collective waits at least this long, and longer than any phase may take (`timeouts.*`), so
# that a rank waiting on a slow peer is reported by the driver's phase timeout, with stacks, rather
# than killed by the collective library's watchdog first.
MIN_COLLECTIVE_TIMEOUT_S = 600.0
# Where a checkpoint step's HF export goes (checkpoint.export_hf), as in verl.
HF_EXPORT_DIR = "huggingface"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def collective_timeout_s(cfg: TrainerConfig) -> float:
    """`timeouts.collective_s` when set, else past the longest phase timeout (and >= 600 s)."""
    if cfg.timeouts.collective_s is not None:
        return cfg.timeouts.collective_s
    phases = dataclasses.asdict(cfg.timeouts)
    del phases["collective_s"]
    return max(MIN_COLLECTIVE_TIMEOUT_S, max(phases.values()) + 60.0)


class PolicyWorker:
    def __init__(self, cfg: TrainerConfig, *, rank: int, world_size: int, num_threads: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.num_threads = num_threads
        self.actor: Actor | None = None
        self.memory: RolloutMemory | None = None
        self.engine: Any = None
        self.tokenizer: Any = None

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
                timeout=timedelta(seconds=collective_timeout_s(self.cfg)),
            )
        device = torch_device(kind, index=0)  # Ray exposes one accelerator per worker
        manual_seed_all(self.cfg.seed, kind=kind)  # same initial state on every rank
        RolloutMemory.start(self.cfg.device.expandable_segments, kind=kind)
        backend = make_backend(self.cfg, device=device)
        self.actor = Actor.for_config(self.cfg, backend)
        self.memory = RolloutMemory.for_config(self.cfg, backend, kind=kind)
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.cfg.actor.model_path, trust_remote_code=self.cfg.actor.trust_remote_code
        )
        if self.cfg.rollout.mode == "sync":  # one_step_off: the engines are rollout workers of their own
            shared = backend.generation_module()
            # The engine allocates as it will run (policy offloaded, expandable segments off: vLLM's
            # sleep-mode allocator refuses them), then sleeps until the first rollout.
            self.memory.before_rollout()
            self.engine = make_rollout_engine(
                self.cfg, device=device, tokenizer=self.tokenizer, policy_module=shared, in_training_ranks=True
            )
            self.rollout_sleep()
        log.info(
            "worker.ready",
            rank=self.rank,
            world_size=self.world_size,
            device=str(device),
            threads=self.num_threads,
            pid=os.getpid(),
        )
        return {
            "rank": self.rank,
            "device": str(device),
            "pid": os.getpid(),
            "dp_rank": backend.dp_rank,
            "dp_size": backend.dp_size,
        }

    def _actor(self) -> Actor:
        if self.actor is None:
            raise RuntimeError("the worker is not set up: call setup() first")
        return self.actor

    # -- rollout ----------------------------------------------------------------------------------
    def rollout_wake(self) -> None:
        """The engine ready to generate. A colocated vLLM engine sleeps at level 2, dropping its
        weights; a step's weight sync rewrites them, but the first rollout, validation before
        training, a second round of dynamic sampling and the step after a validation come after a
        sleep with no sync since: then the policy's weights are synced first (before the policy is
        offloaded), so nothing ever generates from dropped weights."""
        if getattr(self.engine, "weights_dropped", False):
            log.info("worker.weights_restored", rank=self.rank, reason="rollout engine slept at level 2 since the last sync")
            self.sync_weights()
        self._memory().before_rollout()
        self.engine.wake_up()

    def rollout_sleep(self) -> None:
        self.engine.sleep()
        self._memory().after_rollout()

    def _memory(self) -> RolloutMemory:
        if self.memory is None:
            raise RuntimeError("the worker is not set up: call setup() first")
        return self.memory

    def generate(self, prompts: list[list[int]], params: SamplingParams, vision: list | None = None) -> list[Generation]:
        return self.engine.generate(prompts, params, vision=vision)

    def sync_weights(self) -> None:
        """The policy's current weights into the colocated rollout engine."""
        self.engine.update_weights(self._actor().backend.named_weights())

    def publish_weights(self) -> list[Any]:
        """The policy's current weights for rollout workers of their own: put in Ray's object store
        by rank 0 (its references; [] on the other ranks, which join the gathering collectives)."""
        return publish_weights(
            self._actor().backend.named_weights(),
            bucket_mb=self.cfg.rollout.weight_sync_bucket_mb,
            keep=self.rank == 0,
        )

    # -- policy -----------------------------------------------------------------------------------
    def log_probs(self, batch: PolicyBatch, *, ref: bool) -> torch.Tensor:
        """[rows, T] log-probs of this rank's rows under the policy (or the reference)."""
        return self._actor().log_probs(batch, ref=ref)["log_probs"]

    def update(self, batch: PolicyBatch, *, num_mini_batches: int, ppo_epochs: int) -> dict[str, float]:
        return self._actor().update(batch, num_mini_batches=num_mini_batches, ppo_epochs=ppo_epochs)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(
        self, step: int, *, trainer_state: dict[str, Any], dataloader_state: dict[str, Any]
    ) -> str:
        from grpo_ckpt import CheckpointManager

        ckpt = self.cfg.checkpoint
        actor = self._actor()
        path = save_actor(
            CheckpointManager(ckpt.dir, max_to_keep=ckpt.max_to_keep),
            step,
            actor,
            contents=ckpt.save_contents,
            trainer_state=trainer_state,
            dataloader_state=dataloader_state,
            transformer_config=actor.backend.model_config(),
        )
        if ckpt.export_hf:
            self._export_hf_into(path, strict=ckpt.strict)
        return str(path)

    def export_checkpoint_hf(self, path: str) -> None:
        """Redo a saved step's HF export (one a stopped run left unfinished)."""
        self._export_hf_into(Path(path), strict=self.cfg.checkpoint.strict)

    def _export_hf_into(self, step_dir: Path, *, strict: bool) -> None:
        """HF weights of a saved step under `<step_dir>/huggingface/`, the outcome recorded in the
        step's manifest. A strict failure leaves the training state complete and resumable, marks
        the export failed, and raises with the keys."""
        from grpo_ckpt import CheckpointManager, StrictExportError

        try:
            outcome = {"status": "ok", **(self.export_hf(str(step_dir / HF_EXPORT_DIR), strict=strict) or {})}
        except StrictExportError as exc:
            if self.rank == 0:
                CheckpointManager.record_hf_export(
                    step_dir,
                    {"status": "failed", "strict": strict, "missing": exc.missing, "unexpected": exc.unexpected},
                )
            raise StrictExportError(
                f"{exc}\nThe training state of this step is saved and resumable: {step_dir} (its "
                f"manifest marks the HF export failed).",
                missing=exc.missing,
                unexpected=exc.unexpected,
            ) from None
        if self.rank == 0:
            CheckpointManager.record_hf_export(step_dir, outcome)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore model/optimizer/scheduler and this rank's RNG, then sync the rollout engine;
        returns the trainer and dataloader state saved with it."""
        from grpo_ckpt import CheckpointManager, restore_rng

        loaded = load_actor(CheckpointManager(Path(path).parent), path, self._actor())
        if loaded.rng is not None:
            restore_rng(loaded.rng)
        if self.engine is not None:  # rollout workers of their own are sent the weights by the driver
            self.sync_weights()
        return {
            "step": loaded.step,
            "trainer_state": loaded.trainer_state,
            "dataloader_state": loaded.dataloader_state,
        }

    def export_hf(self, path: str, *, strict: bool) -> dict[str, Any] | None:
        """HF weights (and the tokenizer) under `path`; the export report's manifest entry on the
        rank that wrote it, None on the others."""
        report = self._actor().backend.export_hf(path, strict=strict)
        if self.rank != 0 or report is None:
            return None
        self.tokenizer.save_pretrained(path)
        return report.to_manifest()

    def shutdown(self) -> None:
        """Stop the rollout engine (it releases its shared memory and device memory) and leave the
        process group."""
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            if getattr(self.engine, "asleep_tags", None) and self.memory is not None:
                # the engine wakes to shut down cleanly (VLLMRolloutEngine.shutdown): room as for a rollout
                try:
                    self.memory.before_rollout()
                except Exception as exc:
                    log.warning("worker.shutdown_offload_failed", rank=self.rank, error=str(exc).splitlines()[0])
            self.engine.shutdown()
            self.engine = None
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
