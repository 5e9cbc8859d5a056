"""A Megatron decoder block built from megatron-core's own (non transformer_engine) modules, for
Qwen3, Qwen3-MoE and the Qwen3.5 hybrid (Gated DeltaNet + gated attention) family.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.local_spec`.
"""

from __future__ import annotations

from functools import partial

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
    get_linear_attention_pattern,
    get_moe_layer_pattern,
    is_linear_attention_variant,
)
from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend
from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
    get_transformer_layer_offset,
)

import grpo_device
from grpo_trainer.backends.megatron.fusions import GatherPermutationDispatcher, rms_norm


class LocalRMSNorm(torch.nn.Module):
    """RMSNorm computed like the HF Qwen models. With `config.layernorm_zero_centered_gamma` the
    scale is `1 + weight` (weight initialised to 0), as Qwen3.5 stores it."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **_: object) -> None:
        super().__init__()
        if config.normalization != "RMSNorm":
            raise ValueError(
                f"the local Megatron spec supports RMSNorm models only, got normalization={config.normalization!r}"
            )
        self.zero_centered = bool(config.layernorm_zero_centered_gamma)
        self.eps = eps
        init = torch.zeros if self.zero_centered else torch.ones
        device = "cpu" if config.use_cpu_initialization else grpo_device.current_device()
        self.weight = torch.nn.Parameter(init(hidden_size, dtype=config.params_dtype, device=device))
        # Megatron all-reduces the gradients of parameters marked so over the tensor-parallel group.
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # HF's order of casts (bf16 results agree with HF's), one fused kernel on CUDA.
        return rms_norm(hidden_states, self.weight, self.eps, self.zero_centered)


class SDPAttention(MegatronModule):
    """Causal core attention through `torch.nn.functional.scaled_dot_product_attention` (flash /
    memory-efficient kernels, GQA without repeating K/V): what TE's fused attention gives, without TE.
    Same interface as megatron-core's `DotProductAttention`; no dropout, no masks but causal."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        **_: object,
    ) -> None:
        super().__init__(config=config)
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"SDPAttention supports causal self-attention only, got {attn_mask_type}")
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism; set parallel.cp=1")
        head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else head_dim**-0.5
        if config.apply_query_key_layer_scaling:
            raise ValueError("apply_query_key_layer_scaling is not supported by SDPAttention")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: object = None,
    ) -> torch.Tensor:
        if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPAttention takes no attention mask, bias or packed sequences (causal only)")
        # [s, b, heads, d] -> [b, heads, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=k.shape[1] != q.shape[1]
        )
        seq, batch = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(seq, batch, -1)


def _self_attention_spec(config: TransformerConfig) -> ModuleSpec:
    # attention_backend auto/flash: SDPA kernels; local/unfused: megatron-core's unfused attention.
    sdpa = config.attention_backend.name in ("auto", "flash")
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=ColumnParallelLinear,
            core_attention=SDPAttention if sdpa else DotProductAttention,
            linear_proj=RowParallelLinear,
            q_layernorm=LocalRMSNorm,
            k_layernorm=LocalRMSNorm,
        ),
    )


def _gated_delta_net_spec() -> ModuleSpec:
    return ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(
            in_proj=ColumnParallelLinear, out_norm=LocalRMSNorm, out_proj=RowParallelLinear
        ),
    )


class _GroupedExpertsSpecProvider(LocalSpecProvider):
    def grouped_mlp_modules(self, moe_use_grouped_gemm: bool) -> partial:
        from grpo_trainer.backends.megatron.grouped_experts import GroupedMMExperts

        return partial(
            GroupedMMExperts,
            submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
        )


class FusedPermutationMoELayer(MoELayer):
    """megatron-core's MoE layer whose all-to-all dispatcher permutes tokens with gathers both ways
    (`fusions.GatherPermutationDispatcher`): `moe_permute_fusion` without transformer_engine."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if type(self.token_dispatcher) is not MoEAlltoAllTokenDispatcher:
            raise ValueError(
                "moe_permute_fusion on the local Megatron layers needs moe_token_dispatcher_type=alltoall, "
                f"got {self.config.moe_token_dispatcher_type!r}"
            )
        GatherPermutationDispatcher.adopt(self.token_dispatcher)


def local_layer_specs(
    config: TransformerConfig, *, grouped_experts: bool = False, fused_permutation: bool = False
) -> list[ModuleSpec]:
    """One spec per decoder layer of the whole model (all pipeline stages). `grouped_experts`:
    MoE experts as grouped GEMMs (`GroupedMMExperts`) instead of `SequentialMLP`;
    `fused_permutation`: tokens permuted for the experts by gathers (`FusedPermutationMoELayer`)."""
    if config.qk_layernorm is False:
        raise ValueError(
            "the local Megatron spec is written for Qwen models with q/k norms (qk_layernorm=True)"
        )
    linear_pattern = [0] * config.num_layers
    if is_linear_attention_variant(config.experimental_attention_variant):
        linear_pattern = get_linear_attention_pattern(config)
    elif config.experimental_attention_variant is not None:
        raise ValueError(
            f"experimental_attention_variant={config.experimental_attention_variant!r} has no local spec here"
        )
    moe_pattern = get_moe_layer_pattern(config) if config.num_moe_experts else [0] * config.num_layers
    backend = _GroupedExpertsSpecProvider() if grouped_experts else LocalSpecProvider()
    dense_mlp = get_mlp_module_spec_for_backend(backend=backend, num_experts=None)
    moe_mlp = (
        get_moe_module_spec_for_backend(
            backend=backend, num_experts=config.num_moe_experts, moe_grouped_gemm=False
        )
        if config.num_moe_experts
        else None
    )
    if moe_mlp is not None and fused_permutation:
        moe_mlp = partial(FusedPermutationMoELayer, *moe_mlp.args, **moe_mlp.keywords)
    specs = []
    for layer in range(config.num_layers):
        attention = _gated_delta_net_spec() if linear_pattern[layer] else _self_attention_spec(config)
        specs.append(
            ModuleSpec(
                module=TransformerLayer,
                submodules=TransformerLayerSubmodules(
                    input_layernorm=LocalRMSNorm,
                    self_attention=attention,
                    self_attn_bda=get_bias_dropout_add,
                    pre_mlp_layernorm=LocalRMSNorm,
                    mlp=moe_mlp if moe_pattern[layer] else dense_mlp,
                    mlp_bda=get_bias_dropout_add,
                ),
            )
        )
    return specs


def local_block_spec(
    config: TransformerConfig,
    vp_stage: int | None = None,
    pp_rank: int | None = None,
    *,
    grouped_experts: bool = False,
    fused_permutation: bool = False,
) -> TransformerBlockSubmodules:
    """The decoder block of this pipeline stage (use as the provider's `transformer_layer_spec`)."""
    if config.pipeline_model_parallel_layout is not None:
        raise ValueError("pipeline_model_parallel_layout is not supported with the local Megatron spec")
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
    count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    specs = local_layer_specs(config, grouped_experts=grouped_experts, fused_permutation=fused_permutation)[
        offset : offset + count
    ]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=LocalRMSNorm)
