"""The gradient norm without a host synchronisation per parameter.

Without TransformerEngine or apex, megatron-core's gradient clipping takes its local
`multi_tensor_l2norm` stand-in, which reads every gradient's norm back to the host (`float()` of
each): at the 35B's expert shape, 4 layers, 2,092 synchronisations an update (docs/benchmarks.md,
"The 35B's expert shape at 4 layers, one H100"). `torch._foreach_norm` computes the same norms on
the device; the one read-back left is megatron-core's own, of the total.
"""

from __future__ import annotations

from typing import Any

import structlog
import torch

log = structlog.get_logger()


def foreach_l2_norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], per_tensor: bool, *args: Any
) -> tuple[torch.Tensor, None]:
    """The l2 norm of every tensor of `tensor_lists[0]` together, as a 1-element float32 tensor on
    their device (megatron-core's `multi_tensor_l2norm` signature; no per-tensor norms)."""
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32), None
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)  # bf16 gradients: fp32 norms
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def use_foreach_grad_norm() -> bool:
    """Put `foreach_l2_norm` in place of megatron-core's local fallback; TE's or apex's kernel,
    when one is installed, stays. True when it was put in place (now or before)."""
    from megatron.core.optimizer import clip_grads
    from megatron.core.utils import local_multi_tensor_l2_norm

    if clip_grads.l2_norm_impl is foreach_l2_norm:
        return True
    if clip_grads.l2_norm_impl is not local_multi_tensor_l2_norm:
        return False
    clip_grads.l2_norm_impl = foreach_l2_norm
    log.info("megatron.grad_norm", impl="torch._foreach_norm", replaces="megatron-core's per-tensor fallback")
    return True
