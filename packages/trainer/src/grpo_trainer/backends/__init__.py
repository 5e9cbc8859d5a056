"""Policy backends: `torch` (Hugging Face model, DDP) and `megatron` (Megatron-Bridge, lazy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from grpo_config.schema import TrainerConfig
    from grpo_trainer.protocols import PolicyBackend

BACKENDS = ("torch", "megatron")


def make_backend(cfg: TrainerConfig, *, device: torch.device) -> PolicyBackend:
    """The `actor.backend` named in `cfg`, built on `device`. torch.distributed must already be
    initialised when the data-parallel world is larger than one."""
    name = cfg.actor.backend
    if name == "torch":
        from grpo_trainer.backends.torch_backend import TorchBackend

        return TorchBackend.for_config(cfg, device=device)
    if name == "megatron":
        from grpo_trainer.backends.megatron import MegatronBackend

        return MegatronBackend.for_config(cfg)  # on the accelerator this process was given (LOCAL_RANK)
    raise ValueError(f"actor.backend={name!r} is unknown; use one of {list(BACKENDS)}")
