"""The `actor` section (its Megatron part: `rules/megatron.py`) and the `ref` section: ranges, the
policy loss, what the Megatron backend cannot honour of them."""

from __future__ import annotations

from grpo_config.rules.common import NotYet, Range, not_yet_problems, range_problems
from grpo_config.schema import TrainerConfig

RANGES: tuple[Range, ...] = (
    ("actor.lr", lambda v: v > 0, "a positive learning rate, e.g. 1e-6"),
    ("actor.lr_warmup_steps", lambda v: v >= 0, ">= 0 steps"),
    ("actor.lr_warmup_steps_ratio", lambda v: 0 <= v <= 1, "in [0, 1] (a share of the run's steps)"),
    ("actor.weight_decay", lambda v: v >= 0, ">= 0"),
    ("actor.grad_clip", lambda v: v > 0, "a positive gradient-norm bound, e.g. 1.0"),
    ("actor.ppo_epochs", lambda v: v >= 1, ">= 1"),
    ("actor.ppo_max_token_len_per_device", lambda v: v >= 1, ">= 1 tokens"),
    ("actor.log_prob_max_token_len_per_device", lambda v: v >= 1, ">= 1 tokens"),
    ("ref.log_prob_max_token_len_per_device", lambda v: v >= 1, ">= 1 tokens"),
    ("actor.clip_ratio_low", lambda v: v >= 0, ">= 0 (PPO clips the ratio to [1 - low, 1 + high])"),
    ("actor.clip_ratio_high", lambda v: v >= 0, ">= 0 (PPO clips the ratio to [1 - low, 1 + high])"),
    ("actor.loss_scale_factor", lambda v: v is None or v > 0, "positive, or null for the response budget"),
    (
        "actor.clip_ratio_c",
        lambda v: v > 1,
        "greater than 1 (dual-clip lower bound of the PPO loss), e.g. 3.0",
    ),
    ("actor.kl_loss_coef", lambda v: v >= 0, ">= 0"),
)

NOT_YET: tuple[NotYet, ...] = (
    (
        "actor.kl_loss_type",
        "full",
        "the full KL needs both models' whole vocabulary distributions at every token, which neither "
        "grpo nor verl keeps (verl raises NotImplementedError for it); use low_var_kl (k3), k1/kl, "
        "k2/mse or abs, or one of them with '+' for the k2 gradient",
    ),
)


def actor_problems(cfg: TrainerConfig) -> list[str]:
    problems = range_problems(cfg, RANGES) + not_yet_problems(cfg, NOT_YET)
    if cfg.actor.backend == "megatron":
        problems += [
            f"{key}=True cannot be honoured on the Megatron backend yet: packed (padding-free) rows need "
            "a core attention that takes sequence boundaries (transformer_engine's, or one not written "
            "for the local layers) and Qwen3.5's Gated DeltaNet trains packed only with FLA's kernels "
            "on Triton >= 3.7.1. Set it to false (rows are padded: the same results, slower) or use "
            "actor.backend=torch, which packs."
            for key, value in (
                ("actor.use_remove_padding", cfg.actor.use_remove_padding),
                # the reference inherits the actor's setting: named once
                ("ref.use_remove_padding", cfg.ref.use_remove_padding and not cfg.actor.use_remove_padding),
            )
            if value
        ]
        if cfg.ref.dtype not in (None, cfg.actor.dtype):
            problems.append(
                f"ref.dtype={cfg.ref.dtype} differs from actor.dtype={cfg.actor.dtype}: the Megatron "
                f"backend builds the reference model in actor.dtype. Unset ref.dtype."
            )
    return problems + policy_loss_problems(cfg) + torch_offload_problems(cfg) + warmup_problems(cfg)


def torch_offload_problems(cfg: TrainerConfig) -> list[str]:
    """The torch backend's offload settings (`actor.torch`, `ref.torch`): read by that backend only,
    and the policy's weights cannot leave the device the hf engine generates with."""
    given = [
        f"{section}.torch.{name}=true"
        for section, torch_section in (("actor", cfg.actor.torch), ("ref", cfg.ref.torch))
        for name in ("param_offload", "optimizer_offload")
        if getattr(torch_section, name, False)
    ]
    if cfg.actor.backend == "megatron" and given:
        return [
            f"{', '.join(given)}: read by the torch backend only, and actor.backend=megatron; its offload "
            "settings are actor.megatron.param_offload / grad_offload / optimizer_offload and "
            "ref.megatron.param_offload."
        ]
    if cfg.actor.backend == "torch" and cfg.actor.torch.param_offload and cfg.rollout.engine == "hf":
        return [
            "actor.torch.param_offload=true with rollout.engine=hf: the hf engine generates with the policy's own "
            "weights, so they cannot leave the device during the rollout. Set it to false, or use rollout.engine=vllm."
        ]
    return []


def warmup_problems(cfg: TrainerConfig) -> list[str]:
    actor = cfg.actor
    if actor.lr_warmup_steps and actor.lr_warmup_steps_ratio:
        return [
            f"actor.lr_warmup_steps={actor.lr_warmup_steps} and actor.lr_warmup_steps_ratio="
            f"{actor.lr_warmup_steps_ratio} both set the warmup (verl takes the steps and ignores the ratio): "
            "keep one of them."
        ]
    return []


def policy_loss_problems(cfg: TrainerConfig) -> list[str]:
    actor, problems = cfg.actor, []
    mode = actor.policy_loss.loss_mode
    if mode != "cispo" and actor.clip_ratio_low > 1:
        problems.append(
            f"actor.clip_ratio_low={actor.clip_ratio_low} makes the ratio's lower clip bound 1 - low negative; "
            "only actor.policy_loss.loss_mode=cispo takes a large low (no lower bound). Use a value <= 1."
        )
    return problems
