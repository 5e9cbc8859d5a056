"""Settings that load but do nothing (their switch is off, as in verl): listed for the user, not refused."""

from __future__ import annotations

import dataclasses

from grpo_config.rules.common import changed_fields
from grpo_config.rules.rollout import VLLM_ONLY
from grpo_config.schema import (
    ActorConfig,
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    MultiTurnConfig,
    OverlongBufferConfig,
    RewardConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
)


def inert_settings(cfg: TrainerConfig) -> list[tuple[list[str], str]]:
    """Settings that do nothing in this config because their switch is off, as in verl (`key=value`
    texts, the reason). Not errors: verl's own scripts carry them (`kl_ctrl.kl_coef` beside
    `use_kl_in_reward=False`); the launch lists them once as ignored, from-verl as comments."""
    algorithm, out = cfg.algorithm, []

    def add(changed: list[str], reason: str) -> None:
        if changed:
            out.append((changed, reason))

    if not algorithm.use_kl_in_reward:
        changed = changed_fields(algorithm, AlgorithmConfig(), ("kl_penalty",), "algorithm")
        changed += changed_fields(
            algorithm.kl_ctrl,
            KLControlConfig(),
            [f.name for f in dataclasses.fields(KLControlConfig)],
            "algorithm.kl_ctrl",
        )
        add(changed, "read with algorithm.use_kl_in_reward=true only, and it is false")
    elif algorithm.kl_ctrl.type == "fixed":
        add(
            changed_fields(
                algorithm.kl_ctrl, KLControlConfig(), ("horizon", "target_kl"), "algorithm.kl_ctrl"
            ),
            "read by the adaptive KL controller only, and algorithm.kl_ctrl.type=fixed",
        )
    groups = algorithm.filter_groups
    if not groups.enable:
        changed = changed_fields(
            groups, FilterGroupsConfig(), ("metric", "max_num_gen_batches"), "algorithm.filter_groups"
        )
        if cfg.data.gen_batch_size not in (None, cfg.data.train_batch_size):
            changed.append(f"data.gen_batch_size={cfg.data.gen_batch_size}")
        add(
            changed,
            "read by dynamic sampling only, and algorithm.filter_groups.enable=false (every generated "
            "prompt is trained on)",
        )
    turns = cfg.rollout.multi_turn
    if not turns.enable:
        names = [f.name for f in dataclasses.fields(MultiTurnConfig) if f.name != "enable"]
        add(
            changed_fields(turns, MultiTurnConfig(), names, "rollout.multi_turn"),
            "read by multi-turn rollouts only, and rollout.multi_turn.enable=false",
        )
    correction = algorithm.rollout_correction
    if correction.rollout_is is None:
        add(
            changed_fields(
                correction,
                RolloutCorrectionConfig(),
                ("rollout_is_threshold", "rollout_is_batch_normalize"),
                "algorithm.rollout_correction",
            ),
            "read with algorithm.rollout_correction.rollout_is=token|sequence only, and it is null",
        )
    if correction.rollout_rs is None and correction.rollout_rs_threshold is not None:
        add(
            [f"algorithm.rollout_correction.rollout_rs_threshold={correction.rollout_rs_threshold!r}"],
            "read with algorithm.rollout_correction.rollout_rs only, and it is null",
        )
    buffer = cfg.reward.overlong_buffer
    if not buffer.enable:
        add(
            changed_fields(
                buffer,
                OverlongBufferConfig(),
                ("len", "penalty_factor", "log", "max_response_length"),
                "reward.overlong_buffer",
            ),
            "read with reward.overlong_buffer.enable=true only, and it is false",
        )
    if cfg.actor.loss_scale_factor is not None and cfg.actor.loss_agg_mode != "seq-mean-token-sum-norm":
        add(
            [f"actor.loss_scale_factor={cfg.actor.loss_scale_factor}"],
            f"read by loss_agg_mode=seq-mean-token-sum-norm only, and actor.loss_agg_mode={cfg.actor.loss_agg_mode}",
        )
    if cfg.reward.custom_fn and cfg.reward.grader != RewardConfig().grader:
        add(
            [f"reward.grader={cfg.reward.grader!r}"],
            f"read by the built-in rewards only, and reward.custom_fn={cfg.reward.custom_fn} scores every item",
        )
    if cfg.actor.policy_loss.loss_mode != "vanilla":
        add(
            changed_fields(cfg.actor, ActorConfig(), ("clip_ratio_c",), "actor"),
            f"read by the vanilla PPO loss's dual clip only, and actor.policy_loss.loss_mode="
            f"{cfg.actor.policy_loss.loss_mode} has none",
        )
    if cfg.actor.backend == "megatron":
        add(
            changed_fields(cfg.actor, ActorConfig(), ("entropy_from_logits_with_chunking",), "actor"),
            "read by the torch backend only (verl's FSDP actor); the Megatron backend computes entropy over "
            "vocabulary-parallel logits, one micro-batch at a time",
        )
    if cfg.logging.val_generations and not (
        cfg.data.val_files and (cfg.test_freq > 0 or cfg.val_before_train)
    ):
        add(
            [f"logging.val_generations={cfg.logging.val_generations}"],
            "read when validation runs (data.val_files with test_freq > 0 or val_before_train), and it does not",
        )
    if algorithm.adv_estimator == "rloo":
        add(
            changed_fields(algorithm, AlgorithmConfig(), ("norm_adv_by_std", "adv_eps"), "algorithm"),
            "read by algorithm.adv_estimator=grpo only (RLOO's leave-one-out advantage has no std normalisation)",
        )
    if cfg.data.val_batch_size is not None:
        add(
            [f"data.val_batch_size={cfg.data.val_batch_size}"],
            "grpo generates the whole validation set in one call per rank (verl deprecated this key too)",
        )
    if not cfg.rollout.val_do_sample:
        add(
            changed_fields(
                cfg.rollout,
                RolloutConfig(),
                ("val_n", "val_temperature", "val_top_p", "val_top_k"),
                "rollout",
            ),
            "read with rollout.val_do_sample=true only (verl's val_kwargs.do_sample); without it validation is "
            "greedy, one response a prompt",
        )
    if cfg.rollout.engine == "hf":
        add(
            changed_fields(cfg.rollout, RolloutConfig(), VLLM_ONLY, "rollout"),
            "read by the vLLM rollout engine only, and rollout.engine=hf (transformers' generate on the policy's "
            "own model)",
        )
    return out
