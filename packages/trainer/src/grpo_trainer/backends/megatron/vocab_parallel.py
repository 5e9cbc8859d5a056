"""Log-probs and entropy from vocabulary-sharded logits, without gathering the full vocabulary.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.vocab_parallel`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class _AllReduceSumIdentityBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return tensor

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output, None


def _group_size(group: Any) -> int:
    if group is None and not dist.is_initialized():
        return 1
    return dist.get_world_size(group=group)


def _sum_over_group(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    if _group_size(group) == 1:
        return tensor
    return _AllReduceSumIdentityBackward.apply(tensor, group)


def _max_over_group(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    tensor = tensor.detach().clone()
    if _group_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int = 0,
    group: Any = None,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of `targets` and (optionally) the entropy under softmax over the full
    vocabulary, from this rank's logits slice `logits[..., V_local]` starting at `vocab_start`.

    Computed in float32. Returns `(log_probs, entropy)` shaped like `targets` (`entropy` is None
    unless asked for). Differentiable with respect to `logits`; with `entropy_grad=False` the
    entropy is a detached metric (no [N, V] product kept for the backward).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} + [vocab]")
    logits = logits.float()
    local_vocab = logits.shape[-1]
    # The max only stabilises exp(); it cancels in the result, so it carries no gradient.
    global_max = _max_over_group(logits.max(dim=-1).values, group)
    shifted = logits - global_max.unsqueeze(-1)
    exp_shifted = shifted.exp()
    sum_exp = _sum_over_group(exp_shifted.sum(dim=-1), group)
    log_sum_exp = sum_exp.log()

    local_targets = targets - vocab_start
    in_slice = (local_targets >= 0) & (local_targets < local_vocab)
    picked = shifted.gather(-1, local_targets.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1)
    target_logit = _sum_over_group(picked * in_slice, group)
    log_probs = target_logit - log_sum_exp

    entropy = None
    if with_entropy:
        # H = log Z - sum_v p_v * z_v, with z the shifted logits and Z = sum_v exp(z_v).
        if entropy_grad:
            weighted = _sum_over_group((exp_shifted * shifted).sum(dim=-1), group)
            entropy = log_sum_exp - weighted / sum_exp
        else:
            with torch.no_grad():
                weighted = _sum_over_group((exp_shifted * shifted).sum(dim=-1), group)
                entropy = log_sum_exp.detach() - weighted / sum_exp.detach()
    return log_probs, entropy
