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
    initialised when the data-parallel world is larger than one. A machine whose kernels cannot
    train the model's Gated DeltaNet layers is refused first (`delta_rule`)."""
    check_delta_rule(cfg, device)
    name = cfg.actor.backend
    if name == "torch":
        from grpo_trainer.backends.torch_backend import TorchBackend

        return TorchBackend.for_config(cfg, device=device)
    if name == "megatron":
        from grpo_trainer.backends.megatron import MegatronBackend

        return MegatronBackend.for_config(cfg)  # on the accelerator this process was given (LOCAL_RANK)
    raise ValueError(f"actor.backend={name!r} is unknown; use one of {list(BACKENDS)}")


def check_delta_rule(cfg: TrainerConfig, device: torch.device) -> None:
    """ValueError (exit 2) when FLA's gated delta-rule backward would refuse this machine mid-update."""
    from grpo_trainer.backends import delta_rule

    found = delta_rule.facts(device)
    if found is None:
        return
    torch_rule = cfg.actor.backend == "megatron" and bool(
        cfg.actor.megatron.override_transformer_config.get("deterministic_mode")
    )
    problem = delta_rule.backward_problem(found, torch_delta_rule=torch_rule)
    if problem is None:
        return
    from transformers import AutoConfig  # read only where the machine would refuse the model

    config = AutoConfig.from_pretrained(cfg.actor.model_path, trust_remote_code=cfg.actor.trust_remote_code)
    if delta_rule.has_linear_attention(config):
        raise ValueError(problem)
