"""grpo's own CPU Gated DeltaNet helpers (`hf_cpu_kernels`) against transformers' PyTorch
references: values, gradients, the cached convolution state, the recurrent state (in and out),
and which calls they take (CPU, unpacked; the delta rule only without autograd)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from grpo_trainer.backends import hf_cpu_kernels, hf_kernels
from grpo_trainer.backends.hf_cpu_kernels import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
    use_own_cpu_kernels,
)

qwen35 = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")


def _reference(name: str):
    function = getattr(qwen35, name)
    while hasattr(function, "__wrapped__"):  # under transformers' hub wrapper and ours
        function = function.__wrapped__
    return function


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("with_bias", [True, False])
def test_causal_convolution_equals_transformers_in_values_and_gradients(activation, with_bias) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True) if with_bias else None
    inputs = [t for t in (x, weight, bias) if t is not None]
    ours = causal_conv1d(x, weight, bias, activation=activation)
    theirs = _reference("causal_conv1d_fn")(x, weight, bias, activation=activation)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    upstream = torch.randn(ours.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(ours, inputs, upstream)
    expected = torch.autograd.grad(theirs, inputs, upstream)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("new_tokens", [1, 2])
def test_the_cached_convolution_step_equals_transformers_and_updates_the_state_alike(new_tokens) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, new_tokens, generator=gen)
    state = torch.randn(4, 6, 4, generator=gen)
    weight, bias = torch.randn(6, 4, generator=gen), torch.randn(6, generator=gen)
    ours_state, their_state = state.clone(), state.clone()
    ours = causal_conv1d_update(x, ours_state, weight, bias, "silu")
    theirs = _reference("causal_conv1d_update")(x, their_state, weight, bias, "silu")
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert torch.equal(ours_state, their_state)
    assert not torch.equal(ours_state, state)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("l2norm", [True, False])
def test_the_recurrent_delta_rule_equals_transformers_with_its_states(steps, l2norm) -> None:
    gen = torch.Generator().manual_seed(2)
    batch, heads, k_dim, v_dim = 3, 2, 8, 5
    q, k = (torch.randn(batch, steps, heads, k_dim, generator=gen) for _ in range(2))
    v = torch.randn(batch, steps, heads, v_dim, generator=gen)
    g = -torch.rand(batch, steps, heads, generator=gen)
    beta = torch.rand(batch, steps, heads, generator=gen)
    initial = torch.randn(batch, heads, k_dim, v_dim, generator=gen)
    kept = initial.clone()
    kwargs = {"g": g, "beta": beta, "output_final_state": True, "use_qk_l2norm_in_kernel": l2norm}
    ours, our_state = recurrent_gated_delta_rule(q, k, v, initial_state=initial, **kwargs)
    theirs, their_state = _reference("torch_recurrent_gated_delta_rule")(q, k, v, initial_state=initial, **kwargs)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_state, their_state, rtol=1e-5, atol=1e-5)
    assert torch.equal(initial, kept)  # the caller's state is not written
    fresh, none = recurrent_gated_delta_rule(q, k, v, g=g, beta=beta)
    torch.testing.assert_close(fresh, _reference("torch_recurrent_gated_delta_rule")(q, k, v, g=g, beta=beta)[0])
    assert none is None


@pytest.mark.parametrize(
    "length,chunk,initial,final",
    [(11, 16, False, False), (11, 16, True, True), (40, 16, True, True), (40, 16, False, False), (5, 8, False, True)],
)
def test_the_chunked_delta_rule_equals_transformers_in_values_states_and_gradients(length, chunk, initial, final) -> None:
    gen = torch.Generator().manual_seed(length)
    batch, heads, k_dim, v_dim = 3, 2, 8, 6
    inputs = [
        torch.randn(batch, length, heads, k_dim, generator=gen, dtype=torch.float64),
        torch.randn(batch, length, heads, k_dim, generator=gen, dtype=torch.float64),
        torch.randn(batch, length, heads, v_dim, generator=gen, dtype=torch.float64),
        -torch.rand(batch, length, heads, generator=gen, dtype=torch.float64),
        torch.rand(batch, length, heads, generator=gen, dtype=torch.float64),
    ]
    inputs = [t.requires_grad_() for t in inputs]
    state = torch.randn(batch, heads, k_dim, v_dim, generator=gen, dtype=torch.float64) if initial else None
    kwargs = {"chunk_size": chunk, "initial_state": state, "output_final_state": final, "use_qk_l2norm_in_kernel": True}
    q, k, v, g, beta = inputs
    ours, our_state = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, **kwargs)
    theirs, their_state = _reference("torch_chunk_gated_delta_rule")(q, k, v, g=g, beta=beta, **kwargs)
    # both compute in float32 inside: equal up to its rounding (one solve for two right-hand sides)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert (our_state is None) is (their_state is None) is not final
    if final:
        torch.testing.assert_close(our_state, their_state, rtol=1e-5, atol=1e-6)
    upstream = torch.randn(ours.shape, generator=gen, dtype=torch.float64)
    for got, want in zip(
        torch.autograd.grad(ours, inputs, upstream), torch.autograd.grad(theirs, inputs, upstream), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_chunked_delta_rule_sizes_its_chunk_when_given_none() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 2, 8, generator=gen) for _ in range(3))
    g, beta = -torch.rand(2, 3, 2, generator=gen), torch.rand(2, 3, 2, generator=gen)
    sized, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta)
    eight, _ = _reference("torch_chunk_gated_delta_rule")(q, k, v, g=g, beta=beta, chunk_size=8)
    assert torch.equal(sized, eight)


def test_own_versions_take_unpacked_cpu_calls_and_the_delta_rule_only_without_autograd(monkeypatch) -> None:
    calls: list[str] = []

    def wrapped(name):
        def function(*args, **kwargs):
            calls.append(name)
            return "wrapped"

        return function

    module = types.ModuleType("fake_qwen35_own")
    for name in hf_cpu_kernels.OWN:
        setattr(module, name, wrapped(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(hf_kernels, "MODULES", (module.__name__,))
    own = {name: (lambda *a, _n=name, **k: f"own {_n}") for name in hf_cpu_kernels.OWN}
    monkeypatch.setattr(hf_cpu_kernels, "OWN", {n: (own[n], grad) for n, (_, grad) in hf_cpu_kernels.OWN.items()})
    assert sorted(use_own_cpu_kernels()) == sorted(f"{module.__name__}.{n}" for n in hf_cpu_kernels.OWN)
    assert use_own_cpu_kernels() == []  # idempotent
    x = torch.ones(2, 3, 4)
    assert module.causal_conv1d_fn(x, x) == "own causal_conv1d_fn"
    assert module.causal_conv1d_fn(x, x, cu_seqlens=torch.tensor([0, 2])) == "wrapped"  # packed
    assert module.causal_conv1d_fn(x.to("meta"), x) == "wrapped"  # not on the CPU
    assert module.causal_conv1d_fn(x, x, cu_seqlens=None) == "own causal_conv1d_fn"
    trained = x.clone().requires_grad_()
    assert module.torch_recurrent_gated_delta_rule(trained, x) == "wrapped"
    with torch.no_grad():
        assert module.torch_recurrent_gated_delta_rule(trained, x) == "own torch_recurrent_gated_delta_rule"
    assert module.causal_conv1d_fn(trained, x) == "own causal_conv1d_fn"  # autograd through the taps
    assert calls == ["causal_conv1d_fn", "causal_conv1d_fn", "torch_recurrent_gated_delta_rule"]


def test_under_cpu_autocast_the_own_kernels_keep_float32_as_transformers_state_updates_do(monkeypatch) -> None:
    """The hf engine generates under bf16 autocast when rollout.dtype is bfloat16: transformers'
    decode step updates its state with elementwise float32 ops, which autocast leaves alone; ours
    uses matrix products, which it would run in bf16, so the wrapper turns autocast off."""
    module = types.ModuleType("fake_qwen35_autocast")
    for name in hf_cpu_kernels.OWN:
        setattr(module, name, _reference(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(hf_kernels, "MODULES", (module.__name__,))
    use_own_cpu_kernels()
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 1, 2, 16, generator=gen) for _ in range(2))
    v = torch.randn(2, 1, 2, 8, generator=gen)
    g, beta = -torch.rand(2, 1, 2, generator=gen), torch.rand(2, 1, 2, generator=gen)
    state = torch.randn(2, 2, 16, 8, generator=gen)
    kwargs = {"g": g, "beta": beta, "initial_state": state, "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ours, our_state = module.torch_recurrent_gated_delta_rule(q, k, v, **kwargs)
        theirs, their_state = _reference("torch_recurrent_gated_delta_rule")(q, k, v, **kwargs)
        chunked, chunk_state = module.torch_chunk_gated_delta_rule(q, k, v, **{**kwargs, "initial_state": None})
    torch.testing.assert_close(our_state, their_state, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert chunk_state.dtype == torch.float32 and chunked.dtype == q.dtype


def test_the_chunked_delta_rule_takes_an_empty_sequence() -> None:
    q, k = torch.zeros(2, 0, 2, 8), torch.zeros(2, 0, 2, 8)
    v, g, beta = torch.zeros(2, 0, 2, 4), torch.zeros(2, 0, 2), torch.zeros(2, 0, 2)
    out, state = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True)
    assert out.shape == (2, 0, 2, 4) and torch.equal(state, torch.zeros(2, 2, 8, 4))
    initial = torch.ones(2, 2, 8, 4)
    assert torch.equal(chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=initial, output_final_state=True)[1], initial)
