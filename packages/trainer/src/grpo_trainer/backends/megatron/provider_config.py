"""grpo_config -> Megatron-Bridge provider settings. Pure: no megatron import, so the mapping and its
validation run (and are tested) anywhere.

`provider_settings(cfg)` returns the provider attributes as a plain dict (field name -> value, the
attention backend as its name); the Megatron part turns the name into `AttnBackend` and sets the
attributes on the real `GPTModelProvider` before `finalize()`.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from grpo_config.schema import ActorConfig, MegatronConfig, ParallelConfig, TrainerConfig

log = structlog.get_logger()

_DTYPE_FLAGS = {
    "bfloat16": {"bf16": True, "fp16": False},
    "float16": {"bf16": False, "fp16": True},
    "float32": {"bf16": False, "fp16": False},
}


class ParallelSizeError(ValueError):
    """Parallel sizes that do not fit the world size or the model."""


class UnknownOverrideFieldError(ValueError):
    """An `override_transformer_config` key that the provider does not have."""


class TransformerEngineRequiredError(ValueError):
    """An option that only works with transformer_engine, asked for where TE is not installed."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The parts of a model's shape that parallel sizes must divide."""

    num_layers: int
    num_attention_heads: int
    num_query_groups: int | None = None
    num_experts: int | None = None


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Sizes of every parallel dimension for one world size."""

    world_size: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    expert_dp: int
    vpp: int | None


def resolve_parallel_layout(
    parallel: ParallelConfig, *, world_size: int, model: ModelShape | None = None
) -> ParallelLayout:
    """Check `parallel` against the world size (and the model when given); return every size,
    data parallel included. Raises `ParallelSizeError` saying what to change."""
    sizes = {"tp": parallel.tp, "pp": parallel.pp, "cp": parallel.cp, "ep": parallel.ep, "etp": parallel.etp}
    for name, size in sizes.items():
        if size < 1:
            raise ParallelSizeError(f"parallel.{name} must be >= 1, got {size}")
    if world_size < 1:
        raise ParallelSizeError(f"world size must be >= 1, got {world_size}")
    model_parallel = parallel.tp * parallel.pp * parallel.cp
    if world_size % model_parallel:
        raise ParallelSizeError(
            f"world size {world_size} is not divisible by tp*pp*cp = {parallel.tp}*{parallel.pp}*{parallel.cp}"
            f" = {model_parallel}; change parallel.tp/pp/cp or the number of devices"
        )
    expert_model_parallel = parallel.etp * parallel.ep * parallel.pp
    if world_size % expert_model_parallel:
        raise ParallelSizeError(
            f"world size {world_size} is not divisible by etp*ep*pp = {parallel.etp}*{parallel.ep}*{parallel.pp}"
            f" = {expert_model_parallel}; change parallel.ep/etp/pp or the number of devices"
        )
    if parallel.vpp is not None:
        if parallel.vpp < 1:
            raise ParallelSizeError(f"parallel.vpp must be >= 1 or null, got {parallel.vpp}")
        if parallel.vpp > 1 and parallel.pp == 1:
            raise ParallelSizeError("parallel.vpp > 1 needs parallel.pp > 1 (interleaved pipeline schedule)")
    if parallel.sequence_parallel and parallel.tp == 1:
        raise ParallelSizeError("parallel.sequence_parallel=true needs parallel.tp > 1; set it to false")
    if model is not None:
        _check_model_divisibility(parallel, model)
    return ParallelLayout(
        world_size=world_size,
        tp=parallel.tp,
        pp=parallel.pp,
        cp=parallel.cp,
        ep=parallel.ep,
        etp=parallel.etp,
        dp=world_size // model_parallel,
        expert_dp=world_size // expert_model_parallel,
        vpp=parallel.vpp if parallel.vpp and parallel.vpp > 1 else None,
    )


def _check_model_divisibility(parallel: ParallelConfig, model: ModelShape) -> None:
    chunks = parallel.pp * (parallel.vpp or 1)
    if model.num_layers % chunks:
        raise ParallelSizeError(
            f"the model's {model.num_layers} layers do not split into pp*vpp = {chunks} equal pipeline chunks;"
            " change parallel.pp/vpp"
        )
    if model.num_attention_heads % parallel.tp:
        raise ParallelSizeError(
            f"the model's {model.num_attention_heads} attention heads are not divisible by parallel.tp={parallel.tp}"
        )
    groups = model.num_query_groups or model.num_attention_heads
    if groups % parallel.tp:
        raise ParallelSizeError(
            f"the model's {groups} key/value heads are not divisible by parallel.tp={parallel.tp}"
        )
    if model.num_experts is None:
        if parallel.ep > 1 or parallel.etp > 1:
            raise ParallelSizeError("parallel.ep/etp > 1 needs a mixture-of-experts model; set them to 1")
        return
    if model.num_experts % parallel.ep:
        raise ParallelSizeError(
            f"the model's {model.num_experts} experts are not divisible by parallel.ep={parallel.ep}"
        )
    if parallel.ep > 1 and parallel.tp > 1 and not parallel.sequence_parallel:
        raise ParallelSizeError(
            "Megatron needs parallel.sequence_parallel=true when both parallel.tp and parallel.ep are > 1"
        )


def provider_settings(
    cfg: TrainerConfig, *, transformer_engine_available: bool, megatron: MegatronConfig | None = None
) -> dict[str, Any]:
    """Provider attributes for the actor (or for `megatron`, e.g. the resolved ref settings).

    `transformer_engine_available=False` refuses the TE-only options with the setting to change.
    `override_transformer_config` is not included: validate it with `validate_overrides` against
    the real provider's fields and apply it last.
    """
    mc = megatron or cfg.actor.megatron
    parallel = cfg.parallel
    _check_transformer_engine_options(mc, parallel, transformer_engine_available=transformer_engine_available)
    if mc.optimizer_offload_fraction and not 0.0 <= mc.optimizer_offload_fraction <= 1.0:
        raise ValueError(
            f"actor.megatron.optimizer_offload_fraction must be in [0, 1], got {mc.optimizer_offload_fraction}"
        )
    recompute = mc.recompute_granularity is not None
    if recompute and mc.recompute_granularity == "full" and mc.recompute_method is None:
        raise ValueError(
            "actor.megatron.recompute_granularity=full needs recompute_method (uniform or block) and "
            "recompute_num_layers"
        )
    local = mc.transformer_impl == "local"
    if local and mc.moe_permute_fusion and mc.moe_token_dispatcher_type != "alltoall":
        raise ValueError(
            "actor.megatron.moe_permute_fusion on the local layers (grpo's own permutation) needs "
            f"moe_token_dispatcher_type=alltoall, got {mc.moe_token_dispatcher_type!r}: set one of the two"
        )
    if _two_stage_interleaved(parallel) and mc.override_transformer_config.get("batch_p2p_comm"):
        raise ValueError(
            "actor.megatron.override_transformer_config.batch_p2p_comm=true with parallel.pp=2 and "
            "parallel.vpp > 1 swaps activations and gradients between the two stages; remove it (grpo "
            "sends unbatched there) or change pp/vpp"
        )
    if mc.moe_token_dispatcher_type == "allgather" and parallel.ep > 1:
        # Its all-gather over an expert-parallel group needs the same token count on every rank of
        # the group, and those ranks hold different data-parallel rows, each micro-batch as long as
        # its own rows (measured on CPU ranks: gloo refuses the sizes; NCCL would fail or misread).
        raise ValueError(
            "actor.megatron.moe_token_dispatcher_type=allgather with parallel.ep > 1 gathers tokens of "
            "micro-batches of different lengths over the expert-parallel ranks; use alltoall (the "
            "launchers' setting) or parallel.ep=1"
        )
    settings: dict[str, Any] = {
        "tensor_model_parallel_size": parallel.tp,
        "pipeline_model_parallel_size": parallel.pp,
        "virtual_pipeline_model_parallel_size": parallel.vpp if parallel.vpp and parallel.vpp > 1 else None,
        "context_parallel_size": parallel.cp,
        "expert_model_parallel_size": parallel.ep,
        "expert_tensor_parallel_size": parallel.etp,
        "sequence_parallel": parallel.sequence_parallel,
        "transformer_impl": mc.transformer_impl,
        **_DTYPE_FLAGS[cfg.actor.dtype],
        # With the local layers our spec picks the experts module (`torch_grouped_experts`); the
        # provider's own flag would ask megatron-core for TE's grouped GEMM.
        "moe_grouped_gemm": mc.moe_grouped_gemm and not local,
        # Likewise the permutation: on the local layers ours (`fusions.TokenPermutation`), TE's otherwise.
        "moe_permute_fusion": mc.moe_permute_fusion and not local,
        "moe_token_dispatcher_type": mc.moe_token_dispatcher_type,
        "moe_aux_loss_coeff": mc.moe_aux_loss_coeff,
        "moe_z_loss_coeff": mc.moe_z_loss_coeff or None,
        "moe_router_load_balancing_type": mc.moe_router_load_balancing_type,
        "recompute_granularity": mc.recompute_granularity,
        "recompute_method": mc.recompute_method if recompute else None,
        "recompute_num_layers": mc.recompute_num_layers if recompute else None,
        "attention_backend": mc.attention_backend,
        "apply_rope_fusion": mc.apply_rope_fusion,
        "gradient_accumulation_fusion": mc.gradient_accumulation_fusion,
        # A training log-prob must be computed from the logits we hold, per vocab shard.
        "parallel_output": True,
        "batch_p2p_comm": not _two_stage_interleaved(parallel),
    }
    if local:
        # The fused kernels below come from TE or apex; the local layers run without them.
        settings.update(
            masked_softmax_fusion=False,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            persist_layer_norm=False,
            cross_entropy_loss_fusion=False,
        )
    return settings


def _two_stage_interleaved(parallel: ParallelConfig) -> bool:
    """PP=2 with virtual stages: the interleaved schedule's batched p2p then sends an activation and a
    gradient of one shape between the same two ranks in one batch, which pairs them in post order,
    swapped (Megatron-LM's own arguments refuse it; megatron-core does not check). Measured on CPU
    ranks: wrong log-probs in the update's forward from the third micro-batch on. Unbatched p2p
    (ordered sends and receives per rank parity) is exact there (docs/LAYOUTS.md)."""
    return parallel.pp == 2 and (parallel.vpp or 1) > 1


def optimizer_settings(actor: ActorConfig) -> dict[str, Any]:
    """megatron-core `OptimizerConfig` fields (but `params_dtype`) for the actor: Adam with grpo's
    settings, the offload ones, then `override_optimizer_config` (grpo_config refuses overrides of
    the fields grpo sets; the Megatron part checks the rest against OptimizerConfig)."""
    megatron = actor.megatron
    offload_fraction = megatron.optimizer_offload_fraction or (1.0 if megatron.optimizer_offload else 0.0)
    return {
        "optimizer": "adam",
        "lr": actor.lr,
        "min_lr": actor.lr,
        "weight_decay": actor.weight_decay,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "clip_grad": actor.grad_clip,
        "bf16": actor.dtype == "bfloat16",
        "fp16": actor.dtype == "float16",
        "use_distributed_optimizer": megatron.use_distributed_optimizer,
        "optimizer_cpu_offload": offload_fraction > 0,
        "optimizer_offload_fraction": offload_fraction,
        "use_precision_aware_optimizer": offload_fraction > 0,
        **megatron.override_optimizer_config,
    }


def torch_grouped_experts(megatron: MegatronConfig) -> bool:
    """True when MoE experts run as `torch._grouped_mm` grouped GEMMs (local layers with
    moe_grouped_gemm=true) rather than megatron-core's `SequentialMLP` loop."""
    return megatron.transformer_impl == "local" and megatron.moe_grouped_gemm


def _check_transformer_engine_options(
    mc: MegatronConfig, parallel: ParallelConfig, *, transformer_engine_available: bool
) -> None:
    needs_te: list[str] = []
    if mc.transformer_impl == "transformer_engine" and not transformer_engine_available:
        needs_te.append("actor.megatron.transformer_impl=local")
    if mc.transformer_impl == "local" or not transformer_engine_available:
        # moe_grouped_gemm, moe_permute_fusion and apply_rope_fusion need no TE: the local spec has its own.
        if parallel.cp > 1:
            needs_te.append("parallel.cp=1")
        if mc.attention_backend == "fused":
            needs_te.append("actor.megatron.attention_backend=auto")
        # The fused weight-gradient accumulation is a TE (or apex) kernel; RoPE fusion on the
        # local layers is megatron-core's rotary function compiled (`fusions.install_compiled_rope`).
        if mc.gradient_accumulation_fusion:
            needs_te.append("actor.megatron.gradient_accumulation_fusion=false")
    if needs_te:
        where = (
            "transformer_impl=local"
            if transformer_engine_available
            else "transformer_engine is not installed"
        )
        raise TransformerEngineRequiredError(
            f"these options need transformer_engine ({where}); set {', '.join(needs_te)}"
        )


def nearest_field(name: str, valid_fields: Collection[str]) -> str | None:
    matches = difflib.get_close_matches(name, list(valid_fields), n=1, cutoff=0.5)
    return matches[0] if matches else None


def validate_overrides(
    overrides: Mapping[str, Any], valid_fields: Collection[str], *, setting: str = "override_transformer_config"
) -> dict[str, Any]:
    """`actor.megatron.<setting>` checked against the fields of what it overrides (the provider's,
    or megatron-core's OptimizerConfig). An unknown key raises `UnknownOverrideFieldError` naming it
    and the nearest valid field."""
    unknown = [key for key in overrides if key not in valid_fields]
    if unknown:
        hints = []
        for key in unknown:
            nearest = nearest_field(key, valid_fields)
            hints.append(f"{key!r} (did you mean {nearest!r}?)" if nearest else repr(key))
        raise UnknownOverrideFieldError(
            f"actor.megatron.{setting} has keys that megatron-core does not have: "
            + ", ".join(hints)
        )
    return dict(overrides)
