"""Settings whose switch is off do nothing, in verl as here: they load, and `inert_settings` names
each with the switch that makes it inert (the launch logs them once as ignored, from-verl writes
them as comments). A setting that would change the run stays refused (test_bad_values.py)."""

from __future__ import annotations

import pytest

from grpo_config import inert_settings, load

INERT = [
    (["algorithm.kl_ctrl.kl_coef=0.01"], "algorithm.kl_ctrl.kl_coef=0.01", "algorithm.use_kl_in_reward=true only"),
    (["algorithm.kl_ctrl.type=adaptive"], "algorithm.kl_ctrl.type='adaptive'", "use_kl_in_reward=true only"),
    (["algorithm.kl_penalty=k3"], "algorithm.kl_penalty='k3'", "use_kl_in_reward=true only"),
    (
        ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.target_kl=0.5"],
        "algorithm.kl_ctrl.target_kl=0.5",
        "adaptive KL controller only",
    ),
    (
        ["algorithm.filter_groups.max_num_gen_batches=10"],
        "algorithm.filter_groups.max_num_gen_batches=10",
        "dynamic sampling only",
    ),
    (["data.gen_batch_size=32"], "data.gen_batch_size=32", "dynamic sampling only"),
    (
        ["algorithm.rollout_correction.rollout_is_threshold=3"],
        "algorithm.rollout_correction.rollout_is_threshold=3.0",
        "rollout_is=token|sequence only",
    ),
    (
        ["algorithm.rollout_correction.rollout_rs_threshold=2"],
        "algorithm.rollout_correction.rollout_rs_threshold='2'",
        "rollout_rs only",
    ),
    (["reward.overlong_buffer.len=4"], "reward.overlong_buffer.len=4", "overlong_buffer.enable=true only"),
    (["actor.loss_scale_factor=4096"], "actor.loss_scale_factor=4096.0", "seq-mean-token-sum-norm only"),
    (
        ["algorithm.adv_estimator=rloo", "algorithm.norm_adv_by_std=false"],
        "algorithm.norm_adv_by_std=False",
        "adv_estimator=grpo only",
    ),
    (["data.val_batch_size=16"], "data.val_batch_size=16", "whole validation set"),
    (
        ["rollout.engine=hf", "rollout.gpu_memory_utilization=0.9"],
        "rollout.gpu_memory_utilization=0.9",
        "vLLM rollout engine only",
    ),
    (["rollout.engine=hf", "rollout.weight_sync_bucket_mb=64"], "rollout.weight_sync_bucket_mb=64", "vLLM"),
    (["rollout.val_temperature=0.6"], "rollout.val_temperature=0.6", "val_do_sample=true only"),
    (
        ["actor.policy_loss.loss_mode=cispo", "actor.clip_ratio_c=10"],
        "actor.clip_ratio_c=10.0",
        "vanilla PPO loss's dual clip only, and actor.policy_loss.loss_mode=cispo",
    ),
    (
        ["reward.overlong_buffer.max_response_length=256"],
        "reward.overlong_buffer.max_response_length=256",
        "overlong_buffer.enable=true only",
    ),
    (
        ["actor.backend=megatron", "actor.entropy_from_logits_with_chunking=true"],
        "actor.entropy_from_logits_with_chunking=True",
        "torch backend only",
    ),
    (["logging.val_generations=4"], "logging.val_generations=4", "read when validation runs"),
    (["reward.custom_fn=my.mod:fn", "reward.grader=lenient"], "reward.grader='lenient'", "built-in rewards only"),
]


@pytest.mark.parametrize(("overrides", "setting", "why"), INERT, ids=lambda v: str(v)[:50])
def test_a_setting_whose_switch_is_off_loads_and_is_named_inert(overrides: list[str], setting: str, why: str) -> None:
    reported = inert_settings(load(None, overrides))
    found = [reason for settings, reason in reported if setting in settings]
    assert found and why in found[0], reported


def test_defaults_and_settings_in_use_are_not_inert() -> None:
    assert inert_settings(load(None, [])) == []
    on = ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.5"]
    assert inert_settings(load(None, on)) == []
