"""With the real Megatron-Bridge / megatron-core (the `megatron` hatch env), on CPU: the bridge
imports without transformer_engine, our settings and overrides land on the bridge's provider, the
override check uses the provider's real fields, the local norm matches HF's, and the local
Qwen3.5-MoE spec round-trips HF weights exactly.

CPU-only patch (documented where used): megatron-core allocates some parameters on
`torch.cuda.current_device()` (Gated DeltaNet); the round-trip test redirects it to the CPU, since
no GPU exists here. Forward/backward are exercised on the GPU by bench/megatron_gpu_run.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from grpo_config.schema import ActorConfig, MegatronConfig, ParallelConfig, TrainerConfig
from grpo_trainer.backends.megatron import UnknownOverrideFieldError, megatron_available, validate_overrides

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(
        not megatron_available(), reason="megatron-bridge is not installed (use the megatron hatch env)"
    ),
]

sys.path.insert(0, str(Path(__file__).parent))
from cpu_ranks import free_port  # noqa: E402

from grpo_tiny import hf_models  # noqa: E402

LOCAL = MegatronConfig(
    transformer_impl="local",
    moe_grouped_gemm=False,
    moe_permute_fusion=False,
    apply_rope_fusion=False,
    moe_token_dispatcher_type="allgather",  # alltoall creates a CUDA stream at construction
    moe_aux_loss_coeff=0.01,
    recompute_granularity="selective",
)


def _cfg(megatron: MegatronConfig = LOCAL) -> TrainerConfig:
    return TrainerConfig(actor=ActorConfig(backend="megatron", megatron=megatron), parallel=ParallelConfig())


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_models.save_random_model(hf_models.qwen35_moe_config(), tmp_path_factory.mktemp("qwen35") / "hf")


@pytest.fixture(scope="module")
def auto_bridge() -> object:
    from grpo_trainer.backends.megatron.imports import import_auto_bridge

    return import_auto_bridge()


def test_bridge_imports_without_leaving_a_fake_transformer_engine(auto_bridge: object) -> None:
    assert auto_bridge.__name__ == "AutoBridge"
    if importlib.util.find_spec("transformer_engine") is None:
        assert "transformer_engine" not in sys.modules
        from megatron.core.models.gpt import gpt_layer_specs

        assert gpt_layer_specs.HAVE_TE is False


def test_override_check_uses_the_real_provider_fields() -> None:
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    fields = {f.name for f in dataclasses.fields(GPTModelProvider)}
    assert validate_overrides({"recompute_granularity": "full", "deterministic_mode": True}, fields)
    with pytest.raises(UnknownOverrideFieldError, match="did you mean 'moe_router_topk'"):
        validate_overrides({"moe_router_top_k": 2}, fields)


def test_optimizer_overrides_are_checked_against_the_real_optimizer_config() -> None:
    from megatron.core.optimizer import OptimizerConfig

    from grpo_trainer.backends.megatron.provider_config import optimizer_settings

    fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    megatron = dataclasses.replace(LOCAL, override_optimizer_config={"overlap_cpu_optimizer_d2h_h2d": True})
    settings = optimizer_settings(_cfg(megatron).actor)
    assert set(settings) <= fields  # every field grpo sets exists in this megatron-core
    OptimizerConfig(**settings)
    with pytest.raises(UnknownOverrideFieldError, match="override_optimizer_config has keys"):
        validate_overrides({"overlap_cpu_optimizer_d2h_h2": True}, fields, setting="override_optimizer_config")


def test_settings_and_overrides_land_on_the_bridge_provider(auto_bridge: object, qwen35_path: Path) -> None:
    from megatron.core.transformer.enums import AttnBackend

    from grpo_trainer.backends.megatron.build import configure_provider
    from grpo_trainer.backends.megatron.local_spec import local_block_spec

    megatron = dataclasses.replace(
        LOCAL, override_transformer_config={"moe_router_topk": 1, "hidden_dropout": 0.0}
    )
    provider = auto_bridge.from_hf_pretrained(str(qwen35_path)).to_megatron_provider(load_weights=False)
    configure_provider(provider, _cfg(megatron), megatron=megatron, seq_length=96)
    spec = provider.transformer_layer_spec
    assert spec.func is local_block_spec
    assert spec.keywords == {"grouped_experts": False, "fused_permutation": False}
    assert provider.moe_router_topk == 1  # override beats the bridge's value from the HF config (2)
    assert provider.moe_grouped_gemm is False and provider.moe_permute_fusion is False
    assert provider.moe_aux_loss_coeff == 0.01 and provider.recompute_granularity == "selective"
    assert provider.attention_backend == AttnBackend.auto and provider.seq_length == 96
    assert provider.bf16 is True and provider.params_dtype == torch.bfloat16
    assert provider.layernorm_zero_centered_gamma is True  # the bridge's Qwen3.5 mapping kept

    bad = dataclasses.replace(LOCAL, override_transformer_config={"moe_router_topkk": 1})
    with pytest.raises(UnknownOverrideFieldError, match="moe_router_topkk"):
        configure_provider(provider, _cfg(bad), megatron=bad, seq_length=96)


@pytest.mark.parametrize("zero_centred", [True, False])
def test_local_rmsnorm_matches_the_hf_norms(zero_centred: bool) -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm

    from grpo_trainer.backends.megatron.local_spec import LocalRMSNorm

    config = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        normalization="RMSNorm",
        layernorm_zero_centered_gamma=zero_centred,
        use_cpu_initialization=True,
    )
    ours = LocalRMSNorm(config, 64, eps=1e-6)
    theirs = Qwen3_5MoeRMSNorm(64, eps=1e-6) if zero_centred else Qwen3RMSNorm(64, eps=1e-6)
    ours, theirs = ours.bfloat16(), theirs.bfloat16()  # as in a bf16 model
    with torch.no_grad():
        ours.weight.normal_(0.0 if zero_centred else 1.0, 0.2)
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(ours(x), theirs(x), atol=0, rtol=0)


@pytest.mark.skipif(
    importlib.util.find_spec("fla") is None, reason="Qwen3.5's Gated DeltaNet needs flash-linear-attention"
)
@pytest.mark.parametrize("grouped", [False, True], ids=["sequential-experts", "grouped-experts"])
def test_local_qwen35_moe_spec_round_trips_hf_weights_exactly(
    auto_bridge: object, qwen35_path: Path, monkeypatch: pytest.MonkeyPatch, grouped: bool
) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from safetensors.torch import load_file

    from grpo_trainer.backends.megatron.build import configure_provider

    # CPU-only: megatron-core puts Gated DeltaNet parameters on torch.cuda.current_device().
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    megatron = dataclasses.replace(
        LOCAL, moe_grouped_gemm=grouped, override_transformer_config={"use_cpu_initialization": True}
    )
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        bridge = auto_bridge.from_hf_pretrained(str(qwen35_path), torch_dtype=torch.bfloat16)
        provider = bridge.to_megatron_provider(load_weights=True)
        configure_provider(provider, _cfg(megatron), megatron=megatron, seq_length=64)
        provider.finalize()
        parallel_state.destroy_model_parallel()  # another module's fixture may still hold the groups
        parallel_state.initialize_model_parallel()
        model = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, bf16=True
        )
        from grpo_trainer.backends.megatron.grouped_experts import GroupedMMExperts

        experts = model[0].module.decoder.layers[0].mlp.experts
        assert isinstance(experts, GroupedMMExperts) is grouped
        names = {name for name, _ in model[0].named_parameters()}
        assert "module.decoder.layers.0.self_attention.in_proj.weight" in names  # Gated DeltaNet layer
        assert "module.decoder.layers.3.self_attention.linear_qkv.weight" in names  # gated attention layer
        assert (
            "module.decoder.layers.0.mlp.experts.local_experts.7.linear_fc1.weight" in names
        )  # SequentialMLP
        exported = dict(bridge.export_hf_weights(model, cpu=True, show_progress=False))
        source = load_file(str(qwen35_path / "model.safetensors"))
        assert sorted(exported) == sorted(source)
        for name, tensor in source.items():
            assert torch.equal(exported[name], tensor), name
    finally:
        parallel_state.destroy_model_parallel()
        if started_here:
            dist.destroy_process_group()


def test_sdpa_core_attention_matches_causal_softmax_attention_with_gqa() -> None:
    """Reference written out: softmax(q k^T * scale + causal mask) v, K/V heads repeated for GQA."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from grpo_trainer.backends.megatron.local_spec import SDPAttention

    config = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=16,
        use_cpu_initialization=True,
    )
    attention = SDPAttention(
        config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
    )
    gen = torch.Generator().manual_seed(0)
    seq, batch = 7, 3
    q = torch.randn(seq, batch, 4, 16, generator=gen)
    k = torch.randn(seq, batch, 2, 16, generator=gen)
    v = torch.randn(seq, batch, 2, 16, generator=gen)
    out = attention(q, k, v, None)

    qh, kh, vh = (
        q.permute(1, 2, 0, 3),
        k.repeat_interleave(2, dim=2).permute(1, 2, 0, 3),
        v.repeat_interleave(2, dim=2).permute(1, 2, 0, 3),
    )
    scores = qh @ kh.transpose(-1, -2) / 4.0
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    expected = (scores.softmax(dim=-1) @ vh).permute(2, 0, 1, 3).reshape(seq, batch, 64)
    assert out.shape == (seq, batch, 64)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="causal self-attention only"):
        SDPAttention(config, layer_number=1, attn_mask_type=AttnMaskType.padding, attention_type="self")


@pytest.mark.parametrize("with_empty_expert", [False, True])
def test_grouped_experts_match_a_per_expert_loop(with_empty_expert: bool) -> None:
    """Grouped GEMM SwiGLU experts (torch._grouped_mm; CPU fallback here) vs a loop over experts
    written out like megatron-core's MLP: values and gradients of inputs and every weight (bf16)."""
    import torch.nn.functional as F

    from grpo_trainer.backends.megatron.grouped_experts import grouped_swiglu_experts

    gen = torch.Generator().manual_seed(0)
    experts, hidden, ffn = 4, 32, 16
    counts = torch.tensor([3, 0, 5, 4] if with_empty_expert else [3, 2, 5, 2])
    tokens = int(counts.sum())
    x = torch.randn(tokens, hidden, generator=gen).bfloat16()
    probs = torch.rand(tokens, generator=gen)
    fc1 = [(torch.randn(2 * ffn, hidden, generator=gen) * 0.2).bfloat16() for _ in range(experts)]
    fc2 = [(torch.randn(hidden, ffn, generator=gen) * 0.2).bfloat16() for _ in range(experts)]
    upstream = torch.randn(tokens, hidden, generator=gen).bfloat16()

    def leaves() -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        return (
            x.clone().requires_grad_(True),
            [w.clone().requires_grad_(True) for w in fc1],
            [w.clone().requires_grad_(True) for w in fc2],
        )

    gx, g1, g2 = leaves()
    out = grouped_swiglu_experts(gx, counts, probs, g1, g2)
    (out.float() * upstream.float()).sum().backward()

    rx, r1, r2 = leaves()
    rows = []
    for index, chunk in enumerate(torch.split(rx, counts.tolist())):
        gate, up = torch.chunk(chunk @ r1[index].T, 2, dim=-1)
        start = int(counts[:index].sum())
        scaled = ((F.silu(gate) * up) * probs[start : start + chunk.shape[0]].unsqueeze(-1)).to(chunk.dtype)
        rows.append(scaled @ r2[index].T)
    ref = torch.cat(rows)
    (ref.float() * upstream.float()).sum().backward()

    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gx.grad, rx.grad, atol=2e-2, rtol=2e-2)
    for ours, theirs in zip(g1 + g2, r1 + r2, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=2e-2, rtol=2e-2)
