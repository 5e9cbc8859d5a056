"""Ref inherits the actor unless set (the 122B review bug: ref lacked use_remove_padding and the
bridge settings the actor had)."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_config import MegatronConfig, ParallelConfig, RefConfig, TrainerConfig, load, resolve_ref
from grpo_config.inherit import INHERITED, OWN
from grpo_config.loader import build
from grpo_config.schema import RefMegatronConfig
from grpo_config.sources import collect


def test_loaded_ref_has_no_none_and_equals_actor() -> None:
    cfg = load()
    for field in dataclasses.fields(RefConfig):
        assert getattr(cfg.ref, field.name) is not None, field.name
    assert set(INHERITED) | OWN == {f.name for f in dataclasses.fields(RefConfig)} and not set(INHERITED) & OWN
    assert cfg.ref.megatron == RefMegatronConfig.of_actor(cfg.actor.megatron) and cfg.ref.parallel == cfg.parallel


def test_actor_settings_reach_ref_the_122b_bug() -> None:
    cfg = load(
        None,
        [
            "actor.backend=megatron",
            "actor.model_path=/models/Qwen3.5-122B-A10B",
            "actor.dtype=float16",
            "actor.use_remove_padding=false",
            "actor.log_prob_micro_batch_size_per_device=2",
            "actor.megatron.transformer_impl=local",
            "actor.megatron.moe_permute_fusion=false",
            "actor.megatron.override_transformer_config.bias_dropout_fusion=false",
            "device.devices_per_node=4",
            "parallel.tp=2",
            "parallel.ep=4",
        ],
    )
    ref = cfg.ref
    assert ref.model_path == "/models/Qwen3.5-122B-A10B"
    assert ref.dtype == "float16"
    assert ref.use_remove_padding is False
    assert ref.log_prob_micro_batch_size_per_device == 2
    assert ref.megatron is not None and ref.megatron.transformer_impl == "local"
    assert ref.megatron.moe_permute_fusion is False
    assert ref.megatron.override_transformer_config == {"bias_dropout_fusion": False}
    assert ref.parallel == ParallelConfig(tp=2, ep=4)


def test_explicit_ref_values_win() -> None:
    cfg = load(
        None,
        [
            "actor.log_prob_micro_batch_size_per_device=2",
            "ref.log_prob_micro_batch_size_per_device=8",
            "ref.dtype=float32",
        ],
    )
    assert cfg.actor.log_prob_micro_batch_size_per_device == 2
    assert cfg.ref.log_prob_micro_batch_size_per_device == 8
    assert cfg.actor.dtype == "bfloat16" and cfg.ref.dtype == "float32"


def test_ref_sections_merge_field_by_field() -> None:
    # Built without the cross-field checks (they refuse a ref layout other than the actor's).
    cfg = build(
        collect(
            {
                "device": {"devices_per_node": 8},
                "parallel": {"tp": 2, "pp": 2, "ep": 2},
                "actor": {
                    "backend": "megatron",
                    "megatron": {
                        "transformer_impl": "local",
                        "override_transformer_config": {"a": 1, "b": 2},
                    },
                },
                "ref": {
                    "parallel": {"tp": 4},
                    "megatron": {"param_offload": True, "override_transformer_config": {"b": 3}},
                },
            },
            [],
        )
    )
    assert cfg.ref.parallel == ParallelConfig(tp=4, pp=2, ep=2)
    assert cfg.ref.megatron is not None
    assert cfg.ref.megatron.param_offload is True and cfg.actor.megatron.param_offload is False
    assert cfg.ref.megatron.transformer_impl == "local"
    assert cfg.ref.megatron.override_transformer_config == {"a": 1, "b": 3}


def test_resolve_ref_on_programmatic_config() -> None:
    cfg = TrainerConfig(ref=RefConfig(use_remove_padding=False, megatron=RefMegatronConfig(param_offload=True)))
    resolved = resolve_ref(cfg)
    assert resolved.ref.use_remove_padding is False  # explicit, kept
    assert resolved.ref.model_path == cfg.actor.model_path and resolved.ref.parallel == cfg.parallel
    assert resolved.ref.megatron == RefMegatronConfig(param_offload=True)  # whole object given: kept as is
    assert resolve_ref(resolved) is resolved  # nothing left to fill


def test_the_reference_section_has_no_training_settings() -> None:
    """ref.megatron is the actor's section less what only training reads; a training setting given
    for the reference is refused in one line, unless it restates the actor's (verl scripts do)."""
    from grpo_config import ConfigError
    from grpo_config.schema import TRAINING_ONLY_MEGATRON

    names = {f.name for f in dataclasses.fields(RefMegatronConfig)}
    assert names == {f.name for f in dataclasses.fields(MegatronConfig)} - set(TRAINING_ONLY_MEGATRON)
    same = load(None, ["actor.backend=megatron", "actor.megatron.recompute_num_layers=2",
                       "actor.megatron.recompute_granularity=full", "actor.megatron.recompute_method=uniform",
                       "ref.megatron.recompute_num_layers=2", "ref.megatron.param_offload=true"])
    assert same.ref.megatron.param_offload and same.ref.megatron.for_build(same.actor.megatron).recompute_num_layers == 2
    with pytest.raises(ConfigError, match=r"^ref\.megatron\.grad_offload=True: the reference model is frozen .* \(actor\.megatron\.grad_offload\)"):
        load(None, ["actor.backend=megatron", "ref.megatron.grad_offload=true"])
