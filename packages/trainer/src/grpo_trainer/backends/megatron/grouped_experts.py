"""MoE experts as two grouped GEMMs (`torch._grouped_mm`) instead of megatron-core's
`SequentialMLP` loop, without transformer_engine.

Parameters stay `local_experts.N.linear_fc{1,2}.weight` (the names Megatron-Bridge maps for
`SequentialMLP`); each forward stacks them into `[E, ...]` tensors for the grouped GEMMs, so HF import
and export are unchanged. Tokens arrive sorted by expert (the token dispatcher's permutation).

Under Megatron's DDP each weight's fp32 `main_grad` is a view into one gradient buffer, where a
layer's experts lie at equal distances: the backward adds the stacked gradient into all of them with
one kernel (as TransformerEngine's fused weight-gradient accumulation does) and hands the weights no
`.grad`, instead of one add and one Python hook per expert weight and micro-batch in Megatron's DDP
(8,432 kernels an update at the 35B's 256 experts x 4 layers: docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
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


def _main_grads_as_one(weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, bool] | None:
    """The experts' main gradients as one `[E, ...]` view of Megatron's gradient buffer, and
    whether it runs in reverse expert order (the buffer lays parameters out backwards); None when
    they are not evenly spaced in one buffer."""
    grads = [getattr(w, "main_grad", None) for w in weights]
    first = grads[0]
    if first is None or any(getattr(w, "zero_out_wgrad", False) for w in weights):
        return None
    storage = first.untyped_storage().data_ptr()
    if any(
        g is None
        or g.untyped_storage().data_ptr() != storage
        or g.shape != first.shape
        or g.dtype != first.dtype
        or not g.is_contiguous()
        for g in grads
    ):
        return None
    offsets = [g.storage_offset() for g in grads]
    if len(offsets) == 1:
        return first.unsqueeze(0), False
    step = offsets[1] - offsets[0]
    if abs(step) < first.numel() or any(b - a != step for a, b in itertools.pairwise(offsets)):
        return None
    view = first.as_strided((len(grads), *first.shape), (abs(step), *first.stride()), min(offsets))
    return view, step < 0


def _stacked_main_grads(weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, bool] | None:
    """`_main_grads_as_one`, kept on the first weight while the same weights' gradient buffer stays
    where it was (its first and last main gradients at the same addresses): the layout is fixed
    from DDP's start, and looking it up costs host time on every backward of every layer."""
    first, last = weights[0], weights[-1]
    key = (len(weights), id(first), id(last))
    cached = getattr(first, "_grpo_stacked_main_grads", None)
    if cached is not None and cached[0] == key:
        _, first_ptr, last_ptr, target = cached
        if first.main_grad.data_ptr() == first_ptr and last.main_grad.data_ptr() == last_ptr:
            return target
    target = _main_grads_as_one(weights)
    if target is not None:
        first._grpo_stacked_main_grads = (key, first.main_grad.data_ptr(), last.main_grad.data_ptr(), target)
    return target


class _StackedExpertWeights(torch.autograd.Function):
    """`torch.stack` of a layer's expert weights whose backward adds the stacked gradient into their
    main gradients at once where the buffer allows it; the weights then get no `.grad` at all, so
    neither autograd's accumulation nor Megatron's per-parameter hook runs for them (grpo's DDP runs
    with `overlap_grad_reduce=False`, where that hook only adds and clears: `build.py`). Else each
    weight's gradient goes on to Megatron's hook, which adds it."""

    @staticmethod
    def forward(ctx: Any, *weights: torch.Tensor) -> torch.Tensor:
        ctx.weights = weights
        return torch.stack(weights)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weights = ctx.weights
        target = _stacked_main_grads(weights)
        if target is None:
            for w in weights:
                w.grad_added_to_main_grad = False  # Megatron's hook adds each one
            return grad.unbind(0)
        view, reversed_order = target
        view.add_(grad.flip(0) if reversed_order else grad)
        for w in weights:
            w.grad_added_to_main_grad = True  # were a hook to see a gradient, it would not add it again
        return (None,) * len(weights)


def stack_expert_weights(weights: list[torch.Tensor]) -> torch.Tensor:
    """`[E, ...]` stack of expert weights for the grouped GEMMs; under Megatron's DDP (weights with
    `main_grad`) the backward accumulates their gradients with one add."""
    if torch.is_grad_enabled() and weights[0].requires_grad and hasattr(weights[0], "main_grad"):
        return _StackedExpertWeights.apply(*weights)
    return torch.stack(weights)


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
    fc1 = stack_expert_weights(fc1_weights)  # [E, 2F, H]
    fc2 = stack_expert_weights(fc2_weights)  # [E, H, F]
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
