"""`use_torch_kernels_on_cpu`: CPU tensors take transformers' PyTorch Gated DeltaNet path even when
transformers bound FLA's Triton kernels (transformers < 5.20 does so whenever FLA imports; newer
releases check the device themselves and hold no `__wrapped__` reference, so nothing is wrapped).
FLA cannot run on a CPU machine, so `_triton_only` stands in for it: a kernel that refuses CPU
tensors as Triton does ("0 active drivers")."""

from __future__ import annotations

import functools
import sys
import types

import pytest
import torch

from grpo_trainer.backends import hf_kernels
from grpo_trainer.backends.hf_kernels import (
    FUNCTIONS,
    chunk_size_for,
    use_torch_kernels_on_cpu,
)


def _triton_only(reference):
    @functools.wraps(reference)
    def kernel(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in (*args, *kwargs.values())):
            raise RuntimeError("0 active drivers ([]). There should only be one.")
        return "kernel"

    return kernel


def _reference_of(function):
    """transformers' PyTorch function under every wrapper (its own hub wrapper, or ours after an
    earlier model load in this process)."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def _reference_rule(query, key, value, g, beta, **kwargs):
    return query + key + value


def test_cpu_inputs_go_to_the_reference_and_packed_ones_are_refused(monkeypatch) -> None:
    """The mechanism on a module shaped as transformers 5.19's modeling file."""
    module = types.ModuleType("fake_qwen35_modeling")
    module.torch_chunk_gated_delta_rule = _triton_only(_reference_rule)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(hf_kernels, "MODULES", (module.__name__, "no.such.module"))
    x = torch.ones(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="0 active drivers"):
        module.torch_chunk_gated_delta_rule(x, x, x, g=x, beta=x)
    assert use_torch_kernels_on_cpu() == ["fake_qwen35_modeling.torch_chunk_gated_delta_rule"]
    assert use_torch_kernels_on_cpu() == []  # once is enough
    torch.testing.assert_close(module.torch_chunk_gated_delta_rule(x, x, x, g=x, beta=x), 3 * x)
    assert module.torch_chunk_gated_delta_rule("no tensor") == "kernel"  # other devices keep the kernel
    with pytest.raises(ValueError, match="cannot keep them apart"):
        module.torch_chunk_gated_delta_rule(x, x, x, g=x, beta=x, cu_seqlens=torch.tensor([0, 2, 4]))


def test_chunk_sizes() -> None:
    assert [chunk_size_for(n) for n in (1, 8, 9, 33, 64, 65)] == [8, 8, 16, 64, 64, 64]


def test_a_sized_chunk_gives_the_64_token_chunks_result() -> None:
    modeling = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    rule = modeling.torch_chunk_gated_delta_rule
    reference = getattr(rule, "__wrapped__", rule)
    while hasattr(reference, "__wrapped__"):
        reference = reference.__wrapped__
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 11, 2, 16, generator=gen) for _ in range(3))
    g = -torch.rand(3, 11, 2, generator=gen)
    beta = torch.rand(3, 11, 2, generator=gen)
    full, state = reference(q, k, v, g=g, beta=beta, chunk_size=64, output_final_state=True, use_qk_l2norm_in_kernel=True)
    sized, sized_state = reference(
        q, k, v, g=g, beta=beta, chunk_size=chunk_size_for(11), output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(sized, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sized_state, state, rtol=1e-5, atol=1e-5)


def test_a_qwen35_forward_on_the_cpu_survives_a_gpu_only_kernel(monkeypatch) -> None:
    modeling = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    if not hasattr(modeling.torch_chunk_gated_delta_rule, "__wrapped__"):
        pytest.skip("this transformers checks the device itself (>= 5.20): nothing to wrap")
    from transformers import Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model, ids = modeling.Qwen3_5MoeForCausalLM(config).eval(), torch.tensor([[3, 5, 7, 9, 11, 13]])
    for name in FUNCTIONS:
        bound = getattr(modeling, name, None)
        if bound is not None:
            monkeypatch.setattr(modeling, name, _triton_only(_reference_of(bound)))
    with pytest.raises(RuntimeError, match="0 active drivers"), torch.no_grad():
        model(input_ids=ids)
    use_torch_kernels_on_cpu()
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_packed_rows_run_each_sequence_on_its_own_through_the_cpu_kernels(monkeypatch) -> None:
    """`segment_packed_sequences_on_cpu`: the causal convolution and the chunked delta rule of a
    packed row (boundaries in `cu_seq_lens_q` / `cu_seqlens`) equal the same functions run on each
    sequence apart; initial states go in and final states come out per sequence."""
    modeling = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    from grpo_trainer.backends.hf_kernels import segment_packed_sequences_on_cpu

    for name in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        function = getattr(modeling, name)
        while getattr(function, "__grpo_segmented__", False):  # wrapped by an earlier model load
            function = function.__wrapped__
        monkeypatch.setattr(modeling, name, function)  # the wrapped one comes back after the test
    conv, rule = modeling.causal_conv1d_fn, modeling.torch_chunk_gated_delta_rule
    segment_packed_sequences_on_cpu()
    assert modeling.causal_conv1d_fn is not conv and modeling.torch_chunk_gated_delta_rule is not rule
    assert segment_packed_sequences_on_cpu() == []  # idempotent
    gen = torch.Generator().manual_seed(0)
    bounds = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    pieces = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))

    x, weight = torch.randn(1, 6, 13, generator=gen), torch.randn(6, 4, generator=gen)
    packed = modeling.causal_conv1d_fn(x, weight, None, activation="silu", cu_seq_lens_q=bounds)
    apart = torch.cat([conv(x[..., a:b], weight, None, activation="silu") for a, b in pieces], dim=-1)
    torch.testing.assert_close(packed, apart)
    assert not torch.allclose(conv(x, weight, None, activation="silu"), apart)  # it leaks without them

    q, k, v = (torch.randn(1, 13, 2, 8, generator=gen) for _ in range(3))
    g, beta = -torch.rand(1, 13, 2, generator=gen), torch.rand(1, 13, 2, generator=gen)
    initial = torch.randn(3, 2, 8, 8, generator=gen)
    out, final = modeling.torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=initial, output_final_state=True, cu_seqlens=bounds,
        use_qk_l2norm_in_kernel=True,
    )
    for index, (a, b) in enumerate(pieces):
        one, one_final = rule(
            q[:, a:b], k[:, a:b], v[:, a:b], g=g[:, a:b], beta=beta[:, a:b],
            initial_state=initial[index : index + 1], output_final_state=True, use_qk_l2norm_in_kernel=True,
        )
        torch.testing.assert_close(out[:, a:b], one, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(final[index : index + 1], one_final, atol=1e-5, rtol=1e-5)
