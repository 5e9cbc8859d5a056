"""The local layers' fused pieces (`grpo_trainer.backends.megatron.fusions`) against what they
replace, on CPU with the real megatron-core: the gather permutation against megatron-core's
`permute` / `unpermute` (values, routing probabilities, gradients), and the settings that turn it on.
The compiled (CUDA) variants run in the GPU tests (`test_megatron_gpu.py`, grouped-experts case).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo_config.schema import ActorConfig, MegatronConfig, TrainerConfig
from grpo_trainer.backends.megatron import megatron_available

pytestmark = [pytest.mark.megatron]
if not megatron_available():  # before the module-level imports further down, which need it
    pytest.skip("megatron-bridge is not installed (`hatch run test` installs it)", allow_module_level=True)


def _top_k_routing(tokens: int, experts: int, topk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=gen)
    top = scores.topk(topk, dim=-1)
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, top.indices, True)
    probs = torch.zeros(tokens, experts).scatter(1, top.indices, top.values.softmax(-1))
    return routing_map, probs


@pytest.mark.parametrize(("tokens", "experts", "topk"), [(13, 6, 2), (40, 8, 8), (1, 4, 1)])
def test_gather_permutation_equals_megatron_cores_permute_and_unpermute(tokens: int, experts: int, topk: int) -> None:
    from megatron.core.transformer.moe.moe_utils import permute, unpermute

    from grpo_trainer.backends.megatron.fusions import TokenPermutation

    routing_map, probs = _top_k_routing(tokens, experts, topk, seed=tokens)
    hidden = torch.randn(tokens, 16, dtype=torch.float64)
    theirs_in, ours_in = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    weights = torch.randn(tokens * topk, 16, dtype=torch.float64)  # stands in for the experts

    rows, theirs_probs, sorted_indices, _, _ = permute(
        theirs_in, routing_map, probs=probs, num_out_tokens=tokens * topk
    )
    theirs = unpermute(rows * weights, sorted_indices, theirs_in.shape, routing_map=routing_map)
    permutation = TokenPermutation(routing_map, topk)
    ours_rows = permutation.permute(ours_in)
    ours = permutation.unpermute(ours_rows * weights)

    assert torch.equal(ours_rows, rows) and torch.equal(permutation.permute_probs(probs), theirs_probs)
    assert torch.equal(permutation.token_of_row, sorted_indices)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(theirs)
    theirs.backward(grad)
    ours.backward(grad)
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=1e-12, atol=1e-12)
    # Every token came back: the sum over its top-k copies of (its row x the expert weight).
    expected = torch.stack(
        [(hidden[t] * weights[permutation.rows_of_token[t]]).sum(0) for t in range(tokens)]
    )
    torch.testing.assert_close(ours.detach(), expected, rtol=1e-12, atol=1e-12)


def test_gather_permutation_keeps_bf16_sums_at_float32_accuracy() -> None:
    """The un-permutation sums a token's copies in one reduction (fp32 accumulation) instead of
    bf16 atomic adds one copy at a time."""
    from grpo_trainer.backends.megatron.fusions import TokenPermutation

    routing_map, _ = _top_k_routing(64, 32, 8, seed=3)
    rows = torch.randn(64 * 8, 256)
    permutation = TokenPermutation(routing_map, 8)
    exact = permutation.unpermute(rows.double())
    ours = permutation.unpermute(rows.bfloat16()).double()
    reference = permutation.unpermute(rows.bfloat16().double())  # the bf16 inputs summed exactly
    assert (ours - reference).abs().max() <= reference.abs().max() * 2**-8
    assert (ours - exact).abs().mean() < 0.02


def _cfg(megatron: MegatronConfig) -> TrainerConfig:
    return TrainerConfig(actor=ActorConfig(model_path="/m", backend="megatron", megatron=megatron))


LOCAL = MegatronConfig(transformer_impl="local", apply_rope_fusion=False, moe_grouped_gemm=True, moe_permute_fusion=True)


def test_local_permute_fusion_is_grpos_own_and_megatron_core_is_not_asked_for_te() -> None:
    from grpo_trainer.backends.megatron.provider_config import provider_settings

    settings = provider_settings(_cfg(LOCAL), transformer_engine_available=False)
    assert settings["moe_permute_fusion"] is False  # megatron-core would ask transformer_engine


def test_local_permute_fusion_needs_the_alltoall_dispatcher() -> None:
    from grpo_trainer.backends.megatron.provider_config import provider_settings

    with pytest.raises(ValueError, match="moe_token_dispatcher_type=alltoall"):
        provider_settings(
            _cfg(dataclasses.replace(LOCAL, moe_token_dispatcher_type="allgather")),
            transformer_engine_available=False,
        )
    off = dataclasses.replace(LOCAL, moe_token_dispatcher_type="allgather", moe_permute_fusion=False)
    assert provider_settings(_cfg(off), transformer_engine_available=False)["moe_permute_fusion"] is False


@pytest.mark.parametrize("fused", [True, False])
def test_the_local_block_spec_builds_moe_layers_with_the_permutation_the_setting_names(fused: bool) -> None:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from grpo_trainer.backends.megatron.local_spec import FusedPermutationMoELayer, local_layer_specs

    config = _tiny_moe_transformer_config()
    specs = local_layer_specs(config, grouped_experts=True, fused_permutation=fused)
    mlp = specs[0].submodules.mlp
    assert mlp.func is (FusedPermutationMoELayer if fused else MoELayer)
    assert issubclass(FusedPermutationMoELayer, MoELayer)


def _tiny_moe_transformer_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_moe_experts=4,
        moe_router_topk=2,
        qk_layernorm=True,
        normalization="RMSNorm",
        use_cpu_initialization=True,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (the compiled kernels)")
def test_compiled_kernels_equal_the_eager_functions_on_cuda_forward_and_backward() -> None:
    from grpo_trainer.backends.megatron.fusions import rms_norm, swiglu_times_probs

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, 3, 256, device="cuda", generator=gen).bfloat16()
    for weight, zero_centered in ((torch.randn(256, device="cuda") * 0.1, True), (torch.rand(256, device="cuda") + 0.5, False)):
        weight = weight.bfloat16()
        eager_in, compiled_in = x.clone().requires_grad_(), x.clone().requires_grad_()
        eager = rms_norm.eager(eager_in, weight, 1e-6, zero_centered)
        compiled = rms_norm(compiled_in, weight, 1e-6, zero_centered)
        # bf16 outputs: at most one rounding step apart (the fp32 reduction order may differ)
        torch.testing.assert_close(compiled, eager, rtol=2**-7, atol=1e-3)
        grad = torch.randn_like(eager)
        eager.backward(grad)
        compiled.backward(grad)
        torch.testing.assert_close(compiled_in.grad, eager_in.grad, rtol=2**-6, atol=1e-2)

    for width in (96, 1300):  # one block, and a loop over blocks (1024 wide) with a masked tail
        rows = torch.randn(300, 2 * width, device="cuda", generator=gen).bfloat16()
        probs = torch.rand(300, device="cuda", generator=gen)
        eager_in, compiled_in = rows.clone().requires_grad_(), rows.clone().requires_grad_()
        eager_probs, compiled_probs = probs.clone().requires_grad_(), probs.clone().requires_grad_()
        eager = swiglu_times_probs.eager(eager_in, eager_probs)
        compiled = swiglu_times_probs(compiled_in, compiled_probs)
        # eager rounds to bf16 after each op, the kernel once: a few elements one bf16 step apart
        torch.testing.assert_close(compiled, eager, rtol=2**-6, atol=2**-6)
        grad = torch.randn_like(eager)
        eager.backward(grad)
        compiled.backward(grad)
        torch.testing.assert_close(compiled_in.grad, eager_in.grad, rtol=2**-6, atol=1e-2)
        torch.testing.assert_close(compiled_probs.grad, eager_probs.grad, rtol=2**-6, atol=width * 2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (the compiled kernels)")
def test_gather_permutation_on_cuda_equals_megatron_cores_in_bf16() -> None:
    from megatron.core.transformer.moe.moe_utils import permute, unpermute

    from grpo_trainer.backends.megatron.fusions import TokenPermutation

    routing_map, _ = _top_k_routing(4096, 32, 8, seed=1)
    routing_map = routing_map.cuda()
    hidden = torch.randn(4096, 512, device="cuda").bfloat16()
    theirs_in, ours_in = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    rows, _, sorted_indices, _, _ = permute(theirs_in, routing_map, num_out_tokens=4096 * 8)
    theirs = unpermute(rows, sorted_indices, hidden.shape, routing_map=routing_map)
    permutation = TokenPermutation(routing_map, 8)
    ours = permutation.unpermute(permutation.permute(ours_in))
    # each token comes back as the sum of its 8 copies: 8 x itself (exact in bf16)
    assert torch.equal(ours, hidden * 8)
    # megatron-core adds the copies one at a time in bf16 (a rounding per add): up to 2 steps off
    torch.testing.assert_close(ours, theirs, rtol=2**-6, atol=0)
    grad = torch.randn_like(hidden)
    theirs.backward(grad)
    ours.backward(grad)
    assert torch.equal(ours_in.grad, grad * 8)
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=2**-6, atol=0)


def test_rope_fusion_on_the_local_layers_is_megatron_cores_rotary_function(monkeypatch) -> None:
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.transformer_config import TransformerConfig

    from grpo_trainer.backends.megatron.fusions import install_compiled_rope

    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", None)  # no transformer_engine
    with pytest.raises(ValueError, match="apply_rope_fusion is not available"):
        TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, apply_rope_fusion=True)
    assert install_compiled_rope() is True
    assert install_compiled_rope() is False  # a kernel is there now
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, apply_rope_fusion=True)
    t = torch.randn(7, 2, 4, 16)
    freqs = torch.randn(7, 1, 1, 8)  # partial rotary: half of each head
    fused = rope_utils.apply_rotary_pos_emb(t, freqs, config=config, cp_group=_NoCP())
    unfused = rope_utils._apply_rotary_pos_emb_bshd(t, freqs)
    assert torch.equal(fused, unfused) and not torch.equal(fused, t)


def test_multimodal_rope_per_row_angles_run_in_the_fused_slot_without_a_warning(monkeypatch) -> None:
    """Qwen3.5's mRoPE gives each row of a micro-batch its own angles. With grpo's rotary in the
    fused slot they go through it at any batch size (megatron-core's mRoPE fallback, whose warning
    says it will become an error, is not reached); with TransformerEngine's kernel there (one angle
    row per position) fusion is turned off for the model instead."""
    import warnings

    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.transformer_config import TransformerConfig

    from grpo_trainer.backends.megatron.fusions import install_compiled_rope, rope_for_per_row_angles

    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", None)
    assert install_compiled_rope() is True
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, apply_rope_fusion=True)
    assert rope_for_per_row_angles(config) == "grpo's compiled rotary function, per-row angles"
    assert config.apply_rope_fusion is True and config.mrope_section is None
    t = torch.randn(7, 2, 4, 16)
    per_row = torch.randn(7, 2, 1, 8)  # each row its own angles
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused = rope_utils.apply_rotary_pos_emb(t, per_row, config=config, cp_group=_NoCP())
    assert torch.equal(fused, rope_utils._apply_rotary_pos_emb_bshd(t, per_row))
    assert not torch.equal(fused[:, 1], rope_utils._apply_rotary_pos_emb_bshd(t, per_row[:, :1])[:, 1])

    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda t, freqs, interleaved=False: t)  # TE's
    te_config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, apply_rope_fusion=True)
    assert "unfused" in rope_for_per_row_angles(te_config)
    assert te_config.apply_rope_fusion is False
    assert rope_for_per_row_angles(te_config) is None  # off: nothing to do


class _NoCP:
    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def test_fused_adam_is_switched_on_only_for_cuda_parameter_groups() -> None:
    from types import SimpleNamespace

    from grpo_trainer.backends.megatron.build import use_fused_torch_adam

    cpu = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    assert use_fused_torch_adam(SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=cpu)])) == 0
    assert not cpu.param_groups[0]["fused"]
    if torch.cuda.is_available():
        gpu = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3, device="cuda"))])
        assert use_fused_torch_adam(SimpleNamespace(optimizer=gpu)) == 1
        assert gpu.param_groups[0]["fused"] and not gpu.param_groups[0]["foreach"]
        gpu.param_groups[0]["params"][0].grad = torch.ones(3, device="cuda")
        gpu.step()  # the fused kernel takes the group as switched
        assert gpu.param_groups[0]["params"][0].detach().cpu().lt(0).all()


def _bare_dispatcher(tp: int, ep: int):
    """The dispatcher's state that its post/pre-processing reads, without building it (megatron-core
    creates a CUDA stream at construction)."""
    from grpo_trainer.backends.megatron.fusions import GatherPermutationDispatcher

    dispatcher = object.__new__(GatherPermutationDispatcher)
    dispatcher.tp_size, dispatcher.ep_size = tp, ep
    dispatcher.tokens_per_expert = torch.tensor([3, 0, 2])
    dispatcher._maybe_dtoh_and_synchronize = lambda point, tokens=None: tokens
    return dispatcher


def test_one_rank_with_every_expert_skips_the_identity_chunk_sort(monkeypatch) -> None:
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    called: list[str] = []
    monkeypatch.setattr(MoEAlltoAllTokenDispatcher, "dispatch_postprocess", lambda self, t, p: called.append("d"))
    monkeypatch.setattr(MoEAlltoAllTokenDispatcher, "combine_preprocess", lambda self, h: called.append("c"))
    tokens, probs = torch.randn(5, 4), torch.rand(5)
    alone = _bare_dispatcher(tp=1, ep=1)
    out_tokens, tokens_per_expert, out_probs = alone.dispatch_postprocess(tokens, probs)
    assert out_tokens is tokens and out_probs is probs  # no copy
    assert tokens_per_expert.tolist() == [3, 0, 2] and alone.tokens_per_expert is None
    assert alone.combine_preprocess(tokens) is tokens and called == []
    shared = _bare_dispatcher(tp=1, ep=2)  # experts on two ranks: megatron-core's sort runs
    shared.dispatch_postprocess(tokens, probs)
    shared.combine_preprocess(tokens)
    assert called == ["d", "c"]


def test_each_input_rank_and_autograd_need_gets_a_compiled_copy_with_its_own_code(monkeypatch) -> None:
    """Dynamo caches compiled variants per code object, up to its recompile limit; the wrapper
    gives each (rank, autograd) kind its own copy. torch.compile is recorded, not run (CPU)."""
    from grpo_trainer.backends.megatron import fusions

    compiled: list = []

    def record(fn, **kwargs):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(fusions.torch, "compile", record)
    norm = fusions.cuda_compiled(fusions._rms_norm, device_type="cpu")
    weight = torch.ones(8, requires_grad=True)
    for shape in ((5, 2, 8), (5, 2, 4, 8), (3, 1, 8)):
        x = torch.randn(shape)
        torch.testing.assert_close(norm(x, weight, 1e-6, False), fusions._rms_norm(x, weight, 1e-6, False))
        with torch.no_grad():
            norm(x, weight, 1e-6, False)
    assert len(compiled) == 4  # (3-D, 4-D) x (grad, no grad); the second 3-D shape reuses its copy
    codes = {id(f.__code__) for f in compiled}  # distinct objects (code objects compare equal by value)
    assert len(codes) == 4 and id(fusions._rms_norm.__code__) not in codes


_INTERPRETED_SWIGLU = """
import torch
from grpo_trainer.backends.megatron.fused_swiglu import swiglu_times_probs
from grpo_trainer.backends.megatron.fusions import _swiglu_times_probs

gen = torch.Generator().manual_seed(0)
for rows, width in ((7, 5), (3, 1300), (0, 8)):
    x = torch.randn(rows, 2 * width, generator=gen, requires_grad=True)
    probs = torch.rand(rows, generator=gen, requires_grad=True)
    ours, theirs = swiglu_times_probs(x, probs), _swiglu_times_probs(x, probs)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    grad = torch.randn(theirs.shape, generator=gen)
    for got, want in zip(
        torch.autograd.grad(ours, (x, probs), grad), torch.autograd.grad(theirs, (x, probs), grad), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("checked")
"""


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs compiled on this machine (the GPU test above); Triton 3.6's interpreter (the H200's) "
    "cannot take the kernels' loop over a runtime width",
)
def test_the_swiglu_kernels_equal_the_float32_expression_in_values_and_gradients() -> None:
    """grpo's Triton SwiGLU x probability kernels run by Triton's interpreter on the CPU (the GPU
    test above runs them compiled), float32 against the eager expression: values, the input's and
    the probabilities' gradients, a width over one block, no rows. In a process of its own: Triton
    reads TRITON_INTERPRET when its own functions are decorated, at import."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED_SWIGLU], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "checked" in done.stdout, done.stderr[-3000:]
