"""The gradient norm of Megatron's clipping on the device (`grad_norm`): the same norm as
megatron-core's per-tensor fallback, without its host read-back per tensor. Clipping with it runs
in every layout's update on CPU ranks (test_layouts.py); its speed is measured on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.optimizer import clip_grads
from megatron.core.utils import local_multi_tensor_l2_norm

from grpo_trainer.backends.megatron.grad_norm import foreach_l2_norm, use_foreach_grad_norm


def test_the_norm_is_the_l2_norm_of_every_gradient_together() -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(shape, generator=gen) for shape in ((3, 5), (7,), (2, 2, 2))]
    grads.append(torch.randn(4, generator=gen).to(torch.bfloat16))
    norm, per_tensor = foreach_l2_norm(2048 * 32, torch.zeros(1, dtype=torch.int), [grads], False)
    expected = torch.linalg.vector_norm(torch.cat([g.float().flatten() for g in grads]))
    assert per_tensor is None and norm.shape == (1,) and norm.dtype == torch.float32
    torch.testing.assert_close(norm[0], expected)
    assert foreach_l2_norm(0, torch.zeros(1), [[]], False)[0].tolist() == [0.0]


def test_it_replaces_only_megatron_cores_fallback(monkeypatch) -> None:
    monkeypatch.setattr(clip_grads, "l2_norm_impl", local_multi_tensor_l2_norm)
    assert use_foreach_grad_norm() and clip_grads.l2_norm_impl is foreach_l2_norm
    assert use_foreach_grad_norm() and clip_grads.l2_norm_impl is foreach_l2_norm  # once is enough

    def kernel(*args):  # TransformerEngine's or apex's multi-tensor kernel
        raise AssertionError("not called here")

    monkeypatch.setattr(clip_grads, "l2_norm_impl", kernel)
    assert not use_foreach_grad_norm() and clip_grads.l2_norm_impl is kernel
