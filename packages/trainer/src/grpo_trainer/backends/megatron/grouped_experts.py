"""MoE experts as two grouped GEMMs (`torch._grouped_mm`) instead of megatron-core's
`SequentialMLP` loop, without transformer_engine.

Parameters stay `local_experts.N.linear_fc{1,2}.weight` (the names Megatron-Bridge maps for
`SequentialMLP`); each forward stacks them into `[E, ...]` views for the grouped GEMMs, so HF import
and export are unchanged. Tokens arrive sorted by expert (the token dispatcher's permutation).
Megatron's gradient hooks still fire: autograd accumulates into every expert's own parameter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP

from grpo_trainer.backends.megatron.fusions import swiglu_times_probs


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient (`_grouped_mm`'s backward refuses
    expanded / zero-stride gradients)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def grouped_swiglu_experts(
    hidden: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    probs: torch.Tensor,
    fc1_weights: list[torch.Tensor],
    fc2_weights: list[torch.Tensor],
) -> torch.Tensor:
    """SwiGLU experts on expert-sorted tokens: for expert e and its rows x,
    `fc2_e((silu(g) * u) * prob)` with `[g; u] = fc1_e(x)`, as megatron-core's MLP computes it."""
    offsets = torch.cumsum(tokens_per_expert.to(device=hidden.device, dtype=torch.int64), 0).to(torch.int32)
    fc1 = torch.stack(fc1_weights)  # [E, 2F, H]
    fc2 = torch.stack(fc2_weights)  # [E, H, F]
    intermediate = torch._grouped_mm(hidden, fc1.transpose(1, 2), offs=offsets)
    activated = swiglu_times_probs(intermediate, probs)
    out = torch._grouped_mm(activated, fc2.transpose(1, 2), offs=offsets)
    return _ContiguousGrad.apply(out)


class GroupedMMExperts(SequentialMLP):
    """`SequentialMLP` whose forward runs all local experts as grouped GEMMs (SwiGLU, no biases)."""

    def forward(
        self,
        permuted_local_hidden_states: torch.Tensor,
        tokens_per_expert: torch.Tensor,
        permuted_probs: torch.Tensor,
    ) -> tuple[torch.Tensor, None]:
        config = self.config
        if (
            config.moe_apply_probs_on_input
            or not config.gated_linear_unit
            or config.activation_func is not F.silu
            or config.add_bias_linear
            or config.glu_linear_offset
            or config.activation_func_clamp_value is not None
            or config.fp8
            or getattr(config, "fp4", None)
        ):
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        out = grouped_swiglu_experts(
            permuted_local_hidden_states,
            tokens_per_expert,
            permuted_probs,
            [expert.linear_fc1.weight for expert in self.local_experts],
            [expert.linear_fc2.weight for expert in self.local_experts],
        )
        return out, None
