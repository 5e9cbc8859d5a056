"""SwiGLU times the routing probability, forward and backward, as two Triton kernels.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.fused_swiglu`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import triton
import triton.language as tl

from grpo_device import DeviceKind, torch_device_module


@triton.jit
def _forward_kernel(x_ptr, p_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    prob = tl.load(p_ptr + row).to(tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask, other=0.0).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up * prob
        tl.store(out_ptr + row * width + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(x_ptr, p_ptr, g_ptr, dx_ptr, dp_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    prob = tl.load(p_ptr + row).to(tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask, other=0.0).to(tl.float32)
        grad = tl.load(g_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        d_gate = grad * prob * up * sig * (1.0 + gate * (1.0 - sig))
        d_up = grad * prob * silu
        tl.store(dx_ptr + row * 2 * width + cols, d_gate.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + row * 2 * width + width + cols, d_up.to(dx_ptr.dtype.element_ty), mask=mask)
        total += grad * silu * up
    tl.store(dp_ptr + row, tl.sum(total, axis=0).to(dp_ptr.dtype.element_ty))


def _current(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device, whatever the tensors' (CPU: the interpreter)."""
    if device.type == DeviceKind.CPU:
        return contextlib.nullcontext()
    return torch_device_module(device.type).device(device)


def _block(width: int) -> int:
    return min(triton.next_power_of_2(width), 1024)


class _SwigluTimesProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, intermediate: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        width = intermediate.shape[-1] // 2
        x = intermediate.reshape(-1, 2 * width).contiguous()
        p = probs.reshape(-1).contiguous()
        if p.numel() != x.shape[0]:
            raise ValueError(f"{x.shape[0]} rows but {p.numel()} probabilities")
        out = torch.empty((x.shape[0], width), dtype=x.dtype, device=x.device)
        if x.shape[0]:
            with _current(x.device):
                _forward_kernel[(x.shape[0],)](x, p, out, width, BLOCK=_block(width))
        ctx.save_for_backward(x, p)
        ctx.shapes = (intermediate.shape, probs.shape)
        return out.view(*intermediate.shape[:-1], width)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, p = ctx.saved_tensors
        width = x.shape[1] // 2
        g = grad.reshape(-1, width).contiguous()
        dx = torch.empty_like(x)
        dp = torch.empty_like(p)
        if x.shape[0]:
            with _current(x.device):
                _backward_kernel[(x.shape[0],)](x, p, g, dx, dp, width, BLOCK=_block(width))
        x_shape, p_shape = ctx.shapes
        return dx.view(x_shape), dp.view(p_shape)


def swiglu_times_probs(intermediate: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up * probs[..., None] for `intermediate` = [..., 2F] (gate | up), `probs` [...]."""
    return _SwigluTimesProbs.apply(intermediate, probs)
