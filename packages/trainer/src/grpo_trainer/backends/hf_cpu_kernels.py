"""grpo's own CPU versions of transformers' PyTorch Gated DeltaNet helpers (Qwen3.5, Qwen3-Next).

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.hf_cpu_kernels`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from grpo_trainer.backends.hf_kernels import _wrap_in_modules, chunk_size_for, packed_boundaries

_OWN = "__grpo_own_cpu__"


def _activate(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return out
    if activation in ("silu", "swish"):
        return F.silu(out)
    from transformers.activations import ACT2FN

    return ACT2FN[activation](out)


def _causal_taps(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, length: int) -> torch.Tensor:
    """out[..., t] = bias + sum_j weight[:, j] * window[..., t + j] for t < length ([B, C, *])."""
    taps = weight.shape[-1]
    out = window[..., :length] * weight[:, :1]
    for j in range(1, taps):
        out = out + window[..., j : j + length] * weight[:, j : j + 1]
    return out if bias is None else out + bias[:, None]


def causal_conv1d(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **_: Any,
) -> torch.Tensor:
    """transformers' `causal_conv1d_fn`: hidden_states [B, C, T], weight [C, K]."""
    length = hidden_states.shape[-1]
    padded = F.pad(hidden_states.to(weight.dtype), (weight.shape[-1] - 1, 0))
    return _activate(_causal_taps(padded, weight, bias, length), activation).to(hidden_states.dtype)


def causal_conv1d_update(
    hidden_states: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """transformers' `causal_conv1d_update`: the new tokens [B, C, L] after the cached ones
    (`conv_state` [B, C, S], S >= K - 1, updated in place to the last S)."""
    length, state_len = hidden_states.shape[-1], conv_state.shape[-1]
    joined = torch.cat([conv_state, hidden_states], dim=-1).to(weight.dtype)
    conv_state.copy_(joined[..., -state_len:])
    window = joined[..., -(length + weight.shape[-1] - 1) :]
    return _activate(_causal_taps(window, weight, bias, length), activation).to(hidden_states.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def recurrent_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' `torch_recurrent_gated_delta_rule` (query/key [B, T, H, Dk], value [B, T, H, Dv],
    g/beta [B, T, H]), without autograd: the state S [B, H, Dk, Dv] is decayed and written in place,
    S = exp(g) S + k (beta (v - k S)), out = (q / sqrt(Dk)) S."""
    dtype = query.dtype
    batch, steps, heads, k_dim = key.shape
    v_dim = value.shape[-1]
    q, k, v, b, decay = (x.transpose(1, 2).float() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * k_dim**-0.5
    if initial_state is None:
        state = torch.zeros(batch, heads, k_dim, v_dim, dtype=torch.float32, device=value.device)
    else:
        state = initial_state.to(torch.float32, copy=True)
    flat = state.view(batch * heads, k_dim, v_dim)
    out = torch.empty(batch, heads, steps, v_dim, dtype=torch.float32, device=value.device)
    for t in range(steps):
        k_t = k[:, :, t].unsqueeze(-2)  # [B, H, 1, Dk]
        state.mul_(decay[:, :, t].exp()[..., None, None])
        delta = (v[:, :, t].unsqueeze(-2) - torch.matmul(k_t, state)) * b[:, :, t, None, None]
        flat.baddbmm_(k_t.reshape(batch * heads, 1, k_dim).transpose(1, 2), delta.reshape(batch * heads, 1, v_dim))
        out[:, :, t] = torch.matmul(q[:, :, t].unsqueeze(-2), state).squeeze(-2)
    return out.transpose(1, 2).contiguous().to(dtype), state if output_final_state else None


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' `torch_chunk_gated_delta_rule`, the same chunked algorithm (UT transform
    within a chunk, a scan over chunks), without the work a zero state makes void: the first
    chunk without an initial state reads no state, and the last chunk writes none unless
    `output_final_state` (for a training or log-prob pass of sequences within one chunk, the
    scan is gone). One triangular solve for both right-hand sides. `chunk_size` None: sized to
    the sequence (`hf_kernels.chunk_size_for`)."""
    dtype = query.dtype
    batch, length, heads, k_dim = key.shape
    v_dim = value.shape[-1]
    if length == 0:
        empty = value.new_zeros(batch, 0, heads, v_dim)
        state = None if initial_state is None else initial_state.float().clone()
        if output_final_state and state is None:
            state = torch.zeros(batch, heads, k_dim, v_dim, dtype=torch.float32, device=value.device)
        return empty, state if output_final_state else None
    chunk = chunk_size or chunk_size_for(length)
    q, k, v, b, decay = (x.transpose(1, 2).float().contiguous() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    q = q * k_dim**-0.5
    pad = (-length) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        b, decay = (F.pad(x, (0, pad)) for x in (b, decay))
    chunks = (length + pad) // chunk
    q, k, v = (x.view(batch, heads, chunks, chunk, x.shape[-1]) for x in (q, k, v))
    b, decay = (x.view(batch, heads, chunks, chunk) for x in (b, decay))
    k_beta, v_beta = k * b[..., None], v * b[..., None]
    cum = decay.cumsum(dim=-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    pairwise = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * pairwise
    attn = (q @ k.transpose(-1, -2)) * pairwise
    decayed_k_beta = k_beta * cum.exp()[..., None]
    solved = torch.linalg.solve_triangular(
        system, torch.cat([v_beta, decayed_k_beta], dim=-1), upper=False, unitriangular=True
    )
    new_values, k_cumdecay = solved.split([v_dim, k_dim], dim=-1)
    state = None if initial_state is None else initial_state.float()
    if chunks > 1 or state is not None or output_final_state:
        q_decayed = q * cum.exp()[..., None]
        k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
        chunk_decay = cum[..., -1].exp()[..., None, None]
    outs = []
    for i in range(chunks):
        if state is None:
            v_new = new_values[:, :, i]
            outs.append(attn[:, :, i] @ v_new)
        else:
            v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
            outs.append(q_decayed[:, :, i] @ state + attn[:, :, i] @ v_new)
        if i < chunks - 1 or output_final_state:
            update = k_to_end[:, :, i].transpose(-1, -2) @ v_new
            state = update if state is None else state * chunk_decay[:, :, i] + update
    out = torch.stack(outs, dim=2).view(batch, heads, -1, v_dim)[:, :, :length]
    return out.transpose(1, 2).contiguous().to(dtype), state if output_final_state else None


def _on_cpu(own: Callable[..., Any], wrapped: Callable[..., Any], *, needs_no_grad: bool) -> Callable[..., Any]:
    @functools.wraps(wrapped)
    def call(first: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if first.device.type != "cpu" or packed_boundaries(kwargs) is not None:
            return wrapped(first, *args, **kwargs)
        if needs_no_grad and torch.is_grad_enabled():
            tensors = (first, *args, *kwargs.values())
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
                return wrapped(first, *args, **kwargs)
        # float32 throughout, under CPU autocast too: transformers' state reads and writes are
        # elementwise float32 ops, which autocast leaves alone; these are matrix products it would not.
        with torch.autocast(device_type="cpu", enabled=False):
            return own(first, *args, **kwargs)

    setattr(call, _OWN, True)
    return call


OWN = {
    "torch_chunk_gated_delta_rule": (chunk_gated_delta_rule, False),
    "causal_conv1d_fn": (causal_conv1d, False),
    "causal_conv1d_update": (causal_conv1d_update, False),
    "torch_recurrent_gated_delta_rule": (recurrent_gated_delta_rule, True),
}


def use_own_cpu_kernels() -> list[str]:
    """Route CPU calls of transformers' Gated DeltaNet helpers (unpacked) to the versions above.
    Call after `hf_kernels.use_torch_kernels_on_cpu` and before `segment_packed_sequences_on_cpu`
    (whose stacked calls then use these too). Returns the names wrapped by this call; idempotent."""
    return _wrap_in_modules(
        tuple(OWN), _OWN, lambda name, function: _on_cpu(OWN[name][0], function, needs_no_grad=OWN[name][1])
    )
