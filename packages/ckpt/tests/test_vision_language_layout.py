"""`restore_vision_language_layout` on a sharded export (an index file) and on a single file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grpo_ckpt.vision_language import INDEX_FILE, VISION_FILE, restore_vision_language_layout


def _source(path: Path) -> Path:
    path.mkdir()
    save_file(
        {
            "model.language_model.embed_tokens.weight": torch.zeros(2),
            "model.visual.patch_embed.proj.weight": torch.full((3,), 7.0),
            "lm_head.weight": torch.zeros(2),
        },
        path / "model.safetensors",
    )
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForConditionalGeneration"]}))
    return path


def test_a_sharded_export_gets_its_index_renamed_and_the_vision_tower_in_its_own_file(tmp_path: Path) -> None:
    source, out = _source(tmp_path / "src"), tmp_path / "out"
    out.mkdir()
    save_file({"model.embed_tokens.weight": torch.ones(2)}, out / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": torch.ones(2)}, out / "model-00002-of-00002.safetensors")
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": 16}, "weight_map": {}}))
    (out / "config.json").write_text("{}")

    copied = restore_vision_language_layout(out, source=source)

    assert copied == ["model.visual.patch_embed.proj.weight"]
    index = json.loads((out / INDEX_FILE).read_text())
    assert index["metadata"] == {"total_size": 16}
    assert index["weight_map"] == {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.language_model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.visual.patch_embed.proj.weight": VISION_FILE,
    }
    assert torch.equal(load_file(out / "model-00001-of-00002.safetensors")["model.language_model.embed_tokens.weight"], torch.ones(2))
    assert torch.equal(load_file(out / VISION_FILE)["model.visual.patch_embed.proj.weight"], torch.full((3,), 7.0))
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]


def test_a_single_file_export_takes_the_vision_tower_in(tmp_path: Path) -> None:
    source, out = _source(tmp_path / "src"), tmp_path / "out"
    out.mkdir()
    save_file({"model.embed_tokens.weight": torch.ones(2), "lm_head.weight": torch.ones(2)}, out / "model.safetensors")
    (out / "config.json").write_text("{}")

    restore_vision_language_layout(out, source=source)

    assert sorted(load_file(out / "model.safetensors")) == [
        "lm_head.weight",
        "model.language_model.embed_tokens.weight",
        "model.visual.patch_embed.proj.weight",
    ]
    assert not (out / INDEX_FILE).exists() and not (out / VISION_FILE).exists()


def test_an_exported_vision_tower_is_kept_not_overwritten_by_the_source_s(tmp_path: Path) -> None:
    """The Megatron backend trains the tower and exports it: the source's copy must not replace it."""
    source, out = _source(tmp_path / "src"), tmp_path / "out"
    out.mkdir()
    trained = {"model.embed_tokens.weight": torch.ones(2), "model.visual.patch_embed.proj.weight": torch.full((3,), 9.0)}
    save_file({**trained, "lm_head.weight": torch.ones(2)}, out / "model.safetensors")
    (out / "config.json").write_text("{}")

    assert restore_vision_language_layout(out, source=source) == []

    assert torch.equal(load_file(out / "model.safetensors")["model.visual.patch_embed.proj.weight"], torch.full((3,), 9.0))
