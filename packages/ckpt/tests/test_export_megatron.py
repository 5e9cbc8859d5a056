"""HF -> Megatron -> HF through the real Megatron-Bridge 0.6.2 / megatron-core 0.19.2 on CPU.

Run with `hatch run test`; skipped where megatron-bridge is not installed. Tiny random
bf16 models; the Megatron side uses the local (non transformer_engine) layer spec, since TE is not
installed. For Qwen3-MoE, `torch.cuda.current_device` is redirected to the CPU device while the
model is built and exported (a test-only patch: megatron-core's MoE layers ask for the CUDA device
even with CPU initialisation; see docs/FACTS.md).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from grpo_ckpt import StrictExportError, export_hf, import_megatron_bridge
from grpo_ckpt.export import EXPORT_MANIFEST, written_keys

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(900)]

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("megatron-bridge is not installed (`hatch run test` installs it)", allow_module_level=True)


@contextmanager
def cpu_current_device() -> Iterator[None]:
    """Test-only: megatron-core's MoE code calls torch.cuda.current_device(); answer with the CPU."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))
        yield


@pytest.fixture(scope="module")
def megatron_world(tmp_path_factory: pytest.TempPathFactory) -> None:
    import torch.distributed as dist

    import_megatron_bridge()
    from megatron.core import parallel_state

    if not dist.is_initialized():
        init_file = tmp_path_factory.mktemp("pg") / "init"
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()  # provide_distributed_model's own init seeds CUDA


def _save_tiny_hf(directory: Path, *, moe: bool) -> Path:
    from grpo_tiny import hf_models  # the repository's test models (grpo-tiny, the test extra)

    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, max_position_embeddings=128)  # fmt: skip
    config = (
        hf_models.qwen3_moe_config(**shape, moe_intermediate_size=32, num_experts=4)
        if moe
        else hf_models.qwen3_dense_config(**shape)
    )
    return hf_models.save_random_model(config, directory)


def _build_megatron(hf_dir: Path, *, moe: bool) -> tuple[Any, list[Any]]:
    from megatron.bridge import AutoBridge
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    provider = bridge.to_megatron_provider(load_weights=True)
    settings: dict[str, Any] = dict(
        transformer_impl="local", use_cpu_initialization=True, gradient_accumulation_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        apply_rope_fusion=False, bias_dropout_fusion=False,
    )
    if moe:  # SequentialMLP experts (names the bridge maps), no TE permutation, no CUDA stream
        settings.update(moe_grouped_gemm=False, moe_permute_fusion=False, moe_token_dispatcher_type="allgather")
    for name, value in settings.items():
        setattr(provider, name, value)
    provider.transformer_layer_spec = get_gpt_layer_local_spec(
        num_experts=provider.num_moe_experts if moe else None, moe_grouped_gemm=False, qk_layernorm=True
    )
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    return bridge, model


@pytest.fixture(scope="module")
def qwen3(megatron_world: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, list[Any]]:
    hf_dir = _save_tiny_hf(tmp_path_factory.mktemp("qwen3") / "hf", moe=False)
    bridge, model = _build_megatron(hf_dir, moe=False)
    return hf_dir, bridge, model


def _variant_source(hf_dir: Path, target: Path, *, add: dict[str, torch.Tensor] | None = None,
                    drop: str | None = None) -> Any:
    """A copy of the HF checkpoint with a tensor added or removed, and a bridge reading it."""
    from megatron.bridge import AutoBridge

    shutil.copytree(hf_dir, target)
    tensors = load_file(target / "model.safetensors")
    tensors.update(add or {})
    tensors.pop(drop, None)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return AutoBridge.from_hf_pretrained(str(target))


def _assert_exact(source_dir: Path, export_dir: Path, *, skip: set[str] = frozenset()) -> None:
    source = load_file(source_dir / "model.safetensors")
    exported: dict[str, torch.Tensor] = {}
    for file in export_dir.glob("*.safetensors"):
        exported.update(load_file(file))
    assert set(exported) == set(source) - skip
    for name, tensor in exported.items():
        assert tensor.dtype == source[name].dtype == torch.bfloat16
        assert (tensor.float() - source[name].float()).abs().max().item() == 0.0, name


@pytest.mark.parametrize("strict", [True, False])
def test_qwen3_round_trip_is_exact(qwen3: tuple[Path, Any, list[Any]], tmp_path: Path, strict: bool) -> None:
    hf_dir, bridge, model = qwen3
    report = export_hf(bridge, model, tmp_path / "out", strict=strict)
    _assert_exact(hf_dir, tmp_path / "out")
    assert report.complete and report.written == written_keys(hf_dir)
    manifest = json.loads((tmp_path / "out" / EXPORT_MANIFEST).read_text())
    assert manifest["hf_export"]["strict"] is strict and manifest["hf_export"]["model_keys_not_written"] == []
    assert manifest["files"]["model.safetensors"]["size"] == (tmp_path / "out" / "model.safetensors").stat().st_size
    # Loadable as it is: the source's config travels with the tensors (the bridge writes tensors only).
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == json.loads((hf_dir / "config.json").read_text())
    assert "config.json" in manifest["files"]


def test_extra_unmapped_source_key(qwen3: tuple[Path, Any, list[Any]], tmp_path: Path) -> None:
    hf_dir, _, model = qwen3
    extra = "model.layers.0.mlp.extra_unmapped.weight"
    bridge = _variant_source(hf_dir, tmp_path / "src", add={extra: torch.ones(4, dtype=torch.bfloat16)})

    with pytest.raises(StrictExportError) as failure:
        export_hf(bridge, model, tmp_path / "strict", strict=True)
    assert failure.value.missing == [extra] and failure.value.unexpected == []
    assert "checkpoint.strict=false" in str(failure.value) and "not written" in str(failure.value)
    assert not (tmp_path / "strict" / EXPORT_MANIFEST).exists()

    report = export_hf(bridge, model, tmp_path / "loose", strict=False)
    assert report.source_keys_not_written == [extra] and report.model_keys_not_written == []
    _assert_exact(tmp_path / "src", tmp_path / "loose", skip={extra})
    recorded = json.loads((tmp_path / "loose" / EXPORT_MANIFEST).read_text())["hf_export"]
    assert recorded["source_keys_not_written"] == [extra]


def test_source_lacking_a_model_key_is_caught(qwen3: tuple[Path, Any, list[Any]], tmp_path: Path) -> None:
    hf_dir, _, model = qwen3
    dropped = "model.layers.1.mlp.down_proj.weight"
    bridge = _variant_source(hf_dir, tmp_path / "src", drop=dropped)

    bridge.save_hf_weights(model, tmp_path / "bridge_only", strict=True, show_progress=False)  # no error...
    assert dropped not in written_keys(tmp_path / "bridge_only")  # ...yet the tensor is gone

    with pytest.raises(StrictExportError) as failure:
        export_hf(bridge, model, tmp_path / "strict", strict=True)
    assert failure.value.missing == [dropped] and failure.value.unexpected == [dropped]
    assert "silently" in str(failure.value)

    report = export_hf(bridge, model, tmp_path / "loose", strict=False)
    assert report.model_keys_not_written == [dropped] and report.source_keys_not_written == []
    assert json.loads((tmp_path / "loose" / EXPORT_MANIFEST).read_text())["hf_export"]["model_keys_not_written"] == [dropped]


def test_qwen3_moe_round_trip_is_exact(megatron_world: None, tmp_path: Path) -> None:
    hf_dir = _save_tiny_hf(tmp_path / "hf", moe=True)
    with cpu_current_device():
        bridge, model = _build_megatron(hf_dir, moe=True)
        report = export_hf(bridge, model, tmp_path / "out", strict=True)
        with pytest.raises(StrictExportError):
            extra = {"model.layers.1.mlp.experts.9.up_proj.weight": torch.ones(2, dtype=torch.bfloat16)}
            export_hf(_variant_source(hf_dir, tmp_path / "src", add=extra), model, tmp_path / "bad", strict=True)
    assert any(".mlp.experts.3.down_proj.weight" in key for key in report.written)
    assert any(".mlp.gate.weight" in key for key in report.written)
    _assert_exact(hf_dir, tmp_path / "out")
