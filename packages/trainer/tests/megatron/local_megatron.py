"""The Megatron settings the GPU tests run with (no TransformerEngine on the GPU machine)."""

from __future__ import annotations

from typing import Any


def local_megatron_config(*, grouped_experts: bool, fused_permutation: bool = False) -> Any:
    """The Megatron settings the GPU tests run with: no TransformerEngine on the GPU machine."""
    from grpo_config.schema import MegatronConfig

    return MegatronConfig(
        transformer_impl="local",
        moe_grouped_gemm=grouped_experts,
        moe_permute_fusion=fused_permutation,
        apply_rope_fusion=fused_permutation,  # the local layers' fused kernels, together
        moe_router_load_balancing_type="none",
        use_distributed_optimizer=True,
        # FLA 0.6's Gated DeltaNet backward refuses Triton < 3.7.1 on Hopper; megatron-core's
        # deterministic mode uses its pure-torch chunked delta rule instead.
        override_transformer_config={"deterministic_mode": True},
    )
