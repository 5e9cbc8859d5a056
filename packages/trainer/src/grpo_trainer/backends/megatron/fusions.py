"""Fused kernels for the local (transformer_engine-free) Megatron layers.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.fusions`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

from grpo_device import DeviceKind


def _own_code(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`fn` with a code object of its own: dynamo keeps its compiled variants, and counts them
    against its recompile limit (8), per code object."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def cuda_compiled(
    fn: Callable[..., torch.Tensor], *, device_type: str = DeviceKind.CUDA
) -> Callable[..., torch.Tensor]:
    """`fn` compiled when its first tensor argument is on `device_type`, eager otherwise.
    Compilation is lazy: importing this module compiles nothing. Shapes are dynamic only where they
    changed (dynamo's automatic dynamic: the token count, not the hidden size, whose static value
    lets the kernels' index arithmetic fold). One compiled copy per
    input rank and autograd need (e.g. RMSNorm on [s, b, h] and on q/k heads; training, log-prob
    and reference passes), each with its own dynamo cache: one shared cache would pass the
    recompile limit on a Qwen3.5 run and silently run the later variants eagerly."""
    compiled: dict[tuple[int, bool], Callable[..., torch.Tensor]] = {}

    def call(first: torch.Tensor, *args: Any) -> torch.Tensor:
        if first.device.type != device_type:
            return fn(first, *args)
        tensors = (first, *(a for a in args if isinstance(a, torch.Tensor)))
        key = (first.dim(), torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        if key not in compiled:
            compiled[key] = torch.compile(_own_code(fn))
        return compiled[key](first, *args)

    call.eager = fn  # type: ignore[attr-defined]
    return call


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    # The same order of casts as the HF Qwen models.
    normed = x.float()
    normed = normed * torch.rsqrt(normed.pow(2).mean(dim=-1, keepdim=True) + eps)
    if zero_centered:  # Qwen3.5: (1 + w) applied in float32
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)  # Qwen3: w applied in the input dtype


rms_norm = cuda_compiled(_rms_norm)


def _swiglu_times_probs(intermediate: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    # megatron-core's MLP: silu(gate) * up, times the token's routing probability, in the
    # intermediate's dtype.
    gate, up = torch.chunk(intermediate, 2, dim=-1)
    return ((F.silu(gate) * up) * probs.unsqueeze(-1)).to(intermediate.dtype)


def swiglu_times_probs(intermediate: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """On CUDA grpo's Triton kernels (`fused_swiglu`: float32 inside, rounded once); eager elsewhere."""
    if intermediate.device.type == DeviceKind.CUDA:
        from grpo_trainer.backends.megatron import fused_swiglu

        return fused_swiglu.swiglu_times_probs(intermediate, probs)
    return _swiglu_times_probs(intermediate, probs)


swiglu_times_probs.eager = _swiglu_times_probs  # type: ignore[attr-defined]


def install_compiled_rope() -> bool:
    """Fill megatron-core's fused-RoPE slot (empty without transformer_engine) with its own
    unfused rotary function, compiled on CUDA: what `apply_rope_fusion=true` then calls for
    [s, b, h, d] inputs. megatron-core keeps its unfused path where TE's kernel would not apply
    (mRoPE with batch > 1, mscale != 1). Returns False when a kernel was there already."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is not None:
        return False
    unfused = rope_utils._apply_rotary_pos_emb_bshd

    def _rope(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
        return unfused(t, freqs, rotary_interleaved=interleaved)

    compiled = cuda_compiled(_rope)

    def fused_apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
        return compiled(t, freqs, interleaved)

    fused_apply_rotary_pos_emb.takes_per_row_angles = True  # type: ignore[attr-defined]
    rope_utils.fused_apply_rotary_pos_emb = fused_apply_rotary_pos_emb
    return True


def rope_for_per_row_angles(config: Any) -> str | None:
    """Multimodal RoPE gives each row of a micro-batch its own angles ([s, b, 1, d]). grpo's compiled
    rotary in megatron-core's fused slot (`install_compiled_rope`) takes them as they are, at any
    batch size. TransformerEngine's fused kernel takes one angle row per position, and megatron-core
    falls back from it with a warning that says it will become an error: fusion is turned off for the
    model instead. Returns what runs, for the log (None: fusion was off)."""
    from megatron.core.models.common.embeddings import rope_utils

    if not config.apply_rope_fusion:
        return None
    if getattr(rope_utils.fused_apply_rotary_pos_emb, "takes_per_row_angles", False):
        return "grpo's compiled rotary function, per-row angles"
    config.apply_rope_fusion = False
    return "megatron-core's unfused rotary function: TransformerEngine's fused RoPE takes one angle row per position"


def _sum_copies(rows: torch.Tensor, rows_of_token: torch.Tensor) -> torch.Tensor:
    # out[t] = sum over j of rows[rows_of_token[t, j]], accumulated in (at least) float32 and
    # rounded once. Written as k gathers added up rather than a gather then a sum over a [T, k, H]
    # view: compiled, that is one pointwise kernel whose loads stay coalesced (the reduction form
    # compiled to a much slower kernel on the H200: docs/benchmarks.md).
    accumulate = torch.promote_types(rows.dtype, torch.float32)
    total = rows.index_select(0, rows_of_token[:, 0]).to(accumulate)
    for copy in range(1, rows_of_token.shape[1]):
        total = total + rows.index_select(0, rows_of_token[:, copy])
    return total.to(rows.dtype)


_sum_copies_fused = cuda_compiled(_sum_copies)


class _Permute(torch.autograd.Function):
    """rows[r] = tokens[token_of_row[r]]; backward: each token sums the gradients of its copies."""

    @staticmethod
    def forward(ctx: Any, tokens: torch.Tensor, token_of_row: torch.Tensor, rows_of_token: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows_of_token)
        return tokens.index_select(0, token_of_row)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (rows_of_token,) = ctx.saved_tensors
        return _sum_copies_fused(grad.contiguous(), rows_of_token), None, None


class _Unpermute(torch.autograd.Function):
    """tokens[t] = sum of rows[rows_of_token[t, :]]; backward: each row takes its token's gradient."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, token_of_row: torch.Tensor, rows_of_token: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(token_of_row)
        return _sum_copies_fused(rows.contiguous(), rows_of_token)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (token_of_row,) = ctx.saved_tensors
        return grad.contiguous().index_select(0, token_of_row), None, None


class TokenPermutation:
    """Tokens sorted by expert, as megatron-core's `permute` orders them (expert by expert, tokens in
    their order within an expert), for a routing map where every token picks exactly `topk`
    experts (top-k routing without capacity dropping or padding)."""

    def __init__(self, routing_map: torch.Tensor, topk: int) -> None:
        num_tokens = routing_map.shape[0]
        flat = routing_map.T.contiguous().view(-1)
        # Positions of the chosen (expert, token) pairs in expert-major order; a stable argsort
        # gives a fixed-size result without a host sync (as megatron-core does).
        self.positions = flat.argsort(descending=True, stable=True)[: num_tokens * topk]
        self.token_of_row = self.positions % num_tokens
        # Each token's rows, in expert order: the inverse of the permutation, for the gathers back.
        self.rows_of_token = torch.argsort(self.token_of_row, stable=True).view(num_tokens, topk)

    def permute(self, tokens: torch.Tensor) -> torch.Tensor:
        return _Permute.apply(tokens, self.token_of_row, self.rows_of_token)

    def permute_probs(self, probs: torch.Tensor) -> torch.Tensor:
        return probs.T.contiguous().view(-1)[self.positions]

    def unpermute(self, rows: torch.Tensor) -> torch.Tensor:
        return _Unpermute.apply(rows, self.token_of_row, self.rows_of_token)


class GatherPermutationDispatcher(MoEAlltoAllTokenDispatcher):
    """megatron-core's all-to-all dispatcher with its local permutation steps (before the
    all-to-all and after it) done by `TokenPermutation`; the all-to-all and the expert-chunk
    sorting are megatron-core's, but where one rank holds every expert (TP x EP = 1) the sorting,
    an identity there, is skipped. Installed on a built dispatcher (`adopt`)."""

    @classmethod
    def adopt(cls, dispatcher: MoEAlltoAllTokenDispatcher) -> None:
        config = dispatcher.config
        unsupported = [
            name
            for name, value in (
                ("moe_expert_capacity_factor", config.moe_expert_capacity_factor),
                ("moe_pad_expert_input_to_capacity", config.moe_pad_expert_input_to_capacity),
                ("moe_router_padding_for_quantization", config.moe_router_padding_for_quantization),
            )
            if value
        ]
        if unsupported:
            raise ValueError(
                "moe_permute_fusion on the local Megatron layers permutes top-k routed tokens "
                f"without dropping or padding; unset {', '.join(unsupported)} or moe_permute_fusion"
            )
        dispatcher.__class__ = cls

    def dispatch_preprocess(
        self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.hidden_shape = hidden_states.shape
        self.probs = probs
        self.routing_map = routing_map
        hidden_states = hidden_states.view(-1, self.hidden_shape[-1])
        self.tokens_per_expert = self.preprocess(routing_map)
        if self.shared_experts is not None:
            self.shared_experts.pre_forward_comm(hidden_states.view(self.hidden_shape))
        self.tokens_per_expert = self._maybe_dtoh_and_synchronize("before_permutation_1", self.tokens_per_expert)
        self.hidden_shape_before_permute = hidden_states.shape
        self.permutation = TokenPermutation(routing_map, self.config.moe_router_topk)
        return self.permutation.permute(hidden_states), self.permutation.permute_probs(probs)

    def _one_rank_holds_every_expert(self) -> bool:
        return self.tp_size * self.ep_size == 1

    def dispatch_postprocess(
        self, global_input_tokens: torch.Tensor, global_probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self._one_rank_holds_every_expert():
            return super().dispatch_postprocess(global_input_tokens, global_probs)
        # Nothing came from other ranks: the tokens are in local-expert order already, and
        # megatron-core's chunk sort (a split and a cat of every token, host syncs for the sizes)
        # would be the identity.
        self.tokens_per_expert = self._maybe_dtoh_and_synchronize("before_permutation_2", self.tokens_per_expert)
        tokens_per_expert = self._maybe_dtoh_and_synchronize("before_finish", self.tokens_per_expert)
        self.tokens_per_expert = None
        return global_input_tokens, tokens_per_expert, global_probs

    def combine_preprocess(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self._one_rank_holds_every_expert():
            return super().combine_preprocess(hidden_states)
        return hidden_states  # the chunk un-sort is the identity too

    def combine_postprocess(self, permutated_local_input_tokens: torch.Tensor) -> torch.Tensor:
        output = self.permutation.unpermute(permutated_local_input_tokens).view(self.hidden_shape)
        self.permutation = None
        if self.shared_experts is not None:
            output += self.shared_experts.get_output()
        return output
