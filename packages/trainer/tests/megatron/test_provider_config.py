"""grpo_config -> Megatron provider settings, parallel-size checks and the override passthrough.
Pure: runs without megatron (the real provider's fields are checked in test_megatron_provider.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from grpo_config.schema import ActorConfig, MegatronConfig, ParallelConfig, RefMegatronConfig, TrainerConfig
from grpo_trainer.backends.megatron import (
    ModelShape,
    ParallelSizeError,
    TransformerEngineRequiredError,
    UnknownOverrideFieldError,
    provider_settings,
    resolve_parallel_layout,
    validate_overrides,
)
from grpo_trainer.backends.megatron.provider_config import optimizer_settings, torch_grouped_experts

LOCAL = MegatronConfig(
    transformer_impl="local", moe_grouped_gemm=False, moe_permute_fusion=False, apply_rope_fusion=False
)


def _cfg(
    megatron: MegatronConfig = LOCAL, parallel: ParallelConfig | None = None, **actor: object
) -> TrainerConfig:
    return TrainerConfig(
        actor=ActorConfig(backend="megatron", megatron=megatron, **actor),
        parallel=parallel or ParallelConfig(),
    )


def test_local_settings_map_every_option() -> None:
    megatron = replace(
        LOCAL,
        moe_token_dispatcher_type="flex",  # not the default; allgather is refused at ep > 1
        moe_aux_loss_coeff=0.001,
        moe_z_loss_coeff=0.0,
        moe_router_load_balancing_type="seq_aux_loss",
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=2,
        attention_backend="unfused",
    )
    parallel = ParallelConfig(tp=2, pp=4, ep=8, etp=1, cp=1, vpp=2, sequence_parallel=True)
    settings = provider_settings(_cfg(megatron, parallel), transformer_engine_available=False)
    assert settings == {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 4,
        "virtual_pipeline_model_parallel_size": 2,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 8,
        "expert_tensor_parallel_size": 1,
        "sequence_parallel": True,
        "transformer_impl": "local",
        "bf16": True,
        "fp16": False,
        "moe_grouped_gemm": False,
        "moe_permute_fusion": False,
        "moe_token_dispatcher_type": "flex",
        "moe_aux_loss_coeff": 0.001,
        "moe_z_loss_coeff": None,
        "moe_router_load_balancing_type": "seq_aux_loss",
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 2,
        "attention_backend": "unfused",
        # TE/apex kernels: the local layers run without them (a request for them is refused).
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "parallel_output": True,
        "batch_p2p_comm": True,
        "masked_softmax_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "persist_layer_norm": False,
        "cross_entropy_loss_fusion": False,
    }


@pytest.mark.parametrize(("pp", "vpp", "batched"), [(2, 2, False), (2, None, True), (4, 2, True), (2, 1, True)])
def test_two_stage_interleaved_pipeline_sends_unbatched(pp: int, vpp: int | None, batched: bool) -> None:
    """PP2 x VPP2's batched p2p swaps activations and gradients between the two ranks (found by the
    CPU layout tests: test_layouts.py)."""
    settings = provider_settings(_cfg(LOCAL, ParallelConfig(pp=pp, vpp=vpp)), transformer_engine_available=False)
    assert settings["batch_p2p_comm"] is batched


def test_batched_p2p_asked_for_at_two_stage_interleaving_is_refused() -> None:
    batched = replace(LOCAL, override_transformer_config={"batch_p2p_comm": True})
    with pytest.raises(ValueError, match="swaps activations and gradients"):
        provider_settings(_cfg(batched, ParallelConfig(pp=2, vpp=2)), transformer_engine_available=False)
    assert provider_settings(_cfg(batched, ParallelConfig(pp=4, vpp=2)), transformer_engine_available=False)["batch_p2p_comm"]


def test_allgather_dispatcher_over_expert_parallel_ranks_is_refused() -> None:
    """Found by the CPU layout runs: EP2 x DP2 with allgather gathers unequal token counts."""
    allgather = replace(LOCAL, moe_token_dispatcher_type="allgather")
    with pytest.raises(ValueError, match="use alltoall"):
        provider_settings(_cfg(allgather, ParallelConfig(ep=2)), transformer_engine_available=False)
    tp_only = ParallelConfig(tp=2, sequence_parallel=True)
    assert provider_settings(_cfg(allgather, tp_only), transformer_engine_available=False)["tensor_model_parallel_size"] == 2


def test_transformer_engine_settings_keep_fusions_and_vpp_of_one_is_none() -> None:
    megatron = MegatronConfig(moe_z_loss_coeff=0.01, apply_rope_fusion=True)
    settings = provider_settings(
        _cfg(megatron, ParallelConfig(vpp=1), dtype="float16"), transformer_engine_available=True
    )
    assert settings["transformer_impl"] == "transformer_engine"
    assert settings["virtual_pipeline_model_parallel_size"] is None
    assert (settings["bf16"], settings["fp16"]) == (False, True)
    assert settings["moe_grouped_gemm"] is True and settings["moe_permute_fusion"] is True
    assert settings["apply_rope_fusion"] is True and settings["moe_z_loss_coeff"] == 0.01
    assert "masked_softmax_fusion" not in settings


def test_default_config_without_transformer_engine_names_every_switch() -> None:
    with pytest.raises(TransformerEngineRequiredError) as err:
        provider_settings(_cfg(MegatronConfig()), transformer_engine_available=False)
    message = str(err.value)
    assert "actor.megatron.transformer_impl=local" in message
    # the local layers have their own grouped GEMMs, token permutation and RoPE kernel
    for own in ("moe_grouped_gemm", "moe_permute_fusion", "apply_rope_fusion"):
        assert own not in message


@pytest.mark.parametrize(
    ("change", "switch"),
    [
        ({"attention_backend": "fused"}, "attention_backend=auto"),
        ({"gradient_accumulation_fusion": True}, "gradient_accumulation_fusion=false"),
    ],
)
def test_local_impl_refuses_te_only_options(change: dict[str, object], switch: str) -> None:
    with pytest.raises(TransformerEngineRequiredError, match=switch):
        provider_settings(_cfg(replace(LOCAL, **change)), transformer_engine_available=True)


def test_local_grouped_gemm_means_torch_grouped_experts() -> None:
    grouped = replace(LOCAL, moe_grouped_gemm=True)
    settings = provider_settings(_cfg(grouped), transformer_engine_available=False)
    assert settings["moe_grouped_gemm"] is False  # the provider must not ask for TE's grouped GEMM
    assert torch_grouped_experts(grouped) is True
    assert torch_grouped_experts(LOCAL) is False
    assert torch_grouped_experts(MegatronConfig()) is False  # TE layers: TE's own grouped GEMM


def test_context_parallel_needs_transformer_engine() -> None:
    with pytest.raises(TransformerEngineRequiredError, match=r"parallel\.cp=1"):
        provider_settings(_cfg(LOCAL, ParallelConfig(cp=2)), transformer_engine_available=False)


def test_full_recompute_needs_a_method() -> None:
    with pytest.raises(ValueError, match="recompute_method"):
        provider_settings(
            _cfg(replace(LOCAL, recompute_granularity="full")), transformer_engine_available=False
        )


def test_offload_fraction_out_of_range() -> None:
    with pytest.raises(ValueError, match="optimizer_offload_fraction"):
        provider_settings(
            _cfg(replace(LOCAL, optimizer_offload_fraction=1.5)), transformer_engine_available=False
        )


def test_ref_settings_can_differ_from_the_actor() -> None:
    """The reference model is built from ref.megatron's model settings (transformer_impl, MoE
    dispatch and losses, attention backend, fusions)."""
    ref = replace(RefMegatronConfig.of_actor(LOCAL), moe_token_dispatcher_type="allgather", attention_backend="unfused")
    settings = provider_settings(_cfg(), transformer_engine_available=False, megatron=ref.for_build(LOCAL))
    actor = provider_settings(_cfg(), transformer_engine_available=False, megatron=LOCAL)
    assert settings["moe_token_dispatcher_type"] == "allgather" != actor["moe_token_dispatcher_type"]
    assert settings["attention_backend"] == "unfused" != actor["attention_backend"]


# -- parallel sizes -----------------------------------------------------------------------------
QWEN35_35B = ModelShape(num_layers=40, num_attention_heads=16, num_query_groups=2, num_experts=256)
QWEN35_122B = ModelShape(num_layers=48, num_attention_heads=32, num_query_groups=2, num_experts=256)


@pytest.mark.parametrize(
    ("parallel", "world", "model", "dp", "expert_dp"),
    [
        (
            ParallelConfig(tp=2, pp=1, ep=8, sequence_parallel=True),
            8,
            QWEN35_35B,
            4,
            1,
        ),  # 35B gpu seed, one node
        (ParallelConfig(tp=2, pp=2, ep=8, sequence_parallel=True), 16, QWEN35_35B, 4, 1),  # 35B npu seed
        (
            ParallelConfig(tp=2, pp=2, ep=8, sequence_parallel=True),
            32,
            QWEN35_122B,
            8,
            2,
        ),  # 122B gpu seed, 4 nodes
        (ParallelConfig(tp=2, pp=4, ep=16, sequence_parallel=True), 64, QWEN35_122B, 8, 1),  # 122B npu seed
        (ParallelConfig(), 1, None, 1, 1),
    ],
)
def test_seed_layouts(
    parallel: ParallelConfig, world: int, model: ModelShape | None, dp: int, expert_dp: int
) -> None:
    layout = resolve_parallel_layout(parallel, world_size=world, model=model)
    assert (layout.dp, layout.expert_dp) == (dp, expert_dp)
    assert layout.tp * layout.pp * layout.cp * layout.dp == world


@pytest.mark.parametrize(
    ("parallel", "world", "model", "match"),
    [
        (ParallelConfig(tp=3), 8, None, "not divisible by tp\\*pp\\*cp"),
        (ParallelConfig(ep=16, pp=2), 16, None, "etp\\*ep\\*pp"),
        (ParallelConfig(vpp=2), 4, None, "needs parallel.pp > 1"),
        (ParallelConfig(tp=1, sequence_parallel=True), 4, None, "sequence_parallel"),
        (ParallelConfig(tp=0), 4, None, "parallel.tp must be >= 1"),
        (ParallelConfig(pp=3), 3, QWEN35_35B, "40 layers"),
        (ParallelConfig(pp=4, vpp=3), 4, QWEN35_35B, "pp\\*vpp = 12"),
        (ParallelConfig(tp=4), 4, QWEN35_35B, "2 key/value heads"),
        (ParallelConfig(tp=32), 32, QWEN35_35B, "16 attention heads"),
        (ParallelConfig(ep=3), 3, QWEN35_35B, "256 experts"),
        (ParallelConfig(tp=2, ep=2), 4, QWEN35_35B, "sequence_parallel=true"),
        (ParallelConfig(ep=2), 2, ModelShape(num_layers=2, num_attention_heads=4), "mixture-of-experts"),
    ],
)
def test_bad_layouts_say_what_to_change(
    parallel: ParallelConfig, world: int, model: ModelShape | None, match: str
) -> None:
    with pytest.raises(ParallelSizeError, match=match):
        resolve_parallel_layout(parallel, world_size=world, model=model)


def test_parallel_size_error_is_a_value_error() -> None:
    assert issubclass(ParallelSizeError, ValueError)
    assert issubclass(UnknownOverrideFieldError, ValueError)
    assert issubclass(TransformerEngineRequiredError, ValueError)


# -- override passthrough -----------------------------------------------------------------------
FIELDS = {
    "recompute_granularity",
    "recompute_method",
    "moe_router_topk",
    "attention_dropout",
    "hidden_dropout",
}


def test_known_overrides_pass_through_unchanged() -> None:
    overrides = {"attention_dropout": 0.0, "moe_router_topk": 4}
    assert validate_overrides(overrides, FIELDS) == overrides
    assert validate_overrides({}, FIELDS) == {}


def test_unknown_override_names_it_and_the_nearest_field() -> None:
    with pytest.raises(UnknownOverrideFieldError) as err:
        validate_overrides({"recompute_granularty": "full", "attention_dropout": 0.1}, FIELDS)
    message = str(err.value)
    assert "'recompute_granularty'" in message
    assert "did you mean 'recompute_granularity'" in message
    assert "attention_dropout" not in message


def test_unknown_override_without_a_near_field() -> None:
    with pytest.raises(UnknownOverrideFieldError) as err:
        validate_overrides({"zzz": 1}, FIELDS)
    assert "'zzz'" in str(err.value) and "did you mean" not in str(err.value)


def test_optimizer_settings_follow_the_actor_and_offload_settings() -> None:
    """actor.lr / weight_decay / grad_clip / dtype, use_distributed_optimizer, optimizer_offload(
    _fraction) and override_optimizer_config become megatron-core OptimizerConfig fields."""
    plain = optimizer_settings(_cfg(lr=2e-6, weight_decay=0.1, grad_clip=0.5).actor)
    assert (plain["lr"], plain["min_lr"], plain["weight_decay"], plain["clip_grad"]) == (2e-6, 2e-6, 0.1, 0.5)
    assert plain["bf16"] and not plain["fp16"] and plain["use_distributed_optimizer"]
    assert not plain["optimizer_cpu_offload"] and plain["optimizer_offload_fraction"] == 0.0
    offloaded = replace(
        LOCAL,
        optimizer_offload=True,
        use_distributed_optimizer=False,
        override_optimizer_config={"overlap_cpu_optimizer_d2h_h2d": True},
    )
    settings = optimizer_settings(_cfg(offloaded).actor)
    assert settings["optimizer_cpu_offload"] and settings["optimizer_offload_fraction"] == 1.0
    assert settings["use_precision_aware_optimizer"] and not settings["use_distributed_optimizer"]
    assert settings["overlap_cpu_optimizer_d2h_h2d"] is True
    half = replace(LOCAL, optimizer_offload_fraction=0.5)
    assert optimizer_settings(_cfg(half).actor)["optimizer_offload_fraction"] == 0.5
