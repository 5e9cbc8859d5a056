"""Qwen3.5's real checkpoint layout (`*ForConditionalGeneration`): the language model under
`model.language_model.*`, the vision tower under `model.visual.*`, `lm_head.*` at the top.

The Megatron backend reads such a checkpoint through a text-only bridge and exports the language
model under text-only names (the vision tower under its own); `restore_vision_language_layout`
turns that export back into the source checkpoint's layout with its config, so it loads where the
source loads (vLLM, transformers' conditional-generation class). A source tensor the export lacks
(a vision tower the model did not hold) is copied unchanged and named in the report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors import safe_open

LANGUAGE_MODEL_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."
VISION_FILE = "model-vision.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def into_language_model_layout(name: str) -> str:
    """A text-only checkpoint name (`model.layers.0...`, `model.embed_tokens.weight`) as the
    vision-language checkpoint of the same model names it; names already in that layout, the
    vision tower's and `lm_head` stay as they are."""
    if name.startswith("model.") and not name.startswith((LANGUAGE_MODEL_PREFIX, VISION_PREFIX)):
        return LANGUAGE_MODEL_PREFIX + name.removeprefix("model.")
    return name


def restore_vision_language_layout(path: str | Path, *, source: str | Path) -> list[str]:
    """Rename the text-only tensors of the export at `path` into `source`'s layout, add the vision
    tensors of `source` that the export lacks (unchanged) in their own file, update the index and
    take `source`'s config.json. Returns the names of the copied vision tensors."""
    from safetensors.torch import load_file, save_file

    path, source = Path(path), Path(source)
    files = sorted(path.glob("*.safetensors"))
    exported = set()
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            exported.update(handle.keys())
    vision = {}
    for file in sorted(source.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            names = [k for k in handle.keys() if k.startswith(VISION_PREFIX) and k not in exported]  # noqa: SIM118
            vision.update({k: handle.get_tensor(k) for k in names})
    sharded = (path / INDEX_FILE).exists()
    weight_map: dict[str, str] = {}
    for file in files:
        tensors = {into_language_model_layout(k): v for k, v in load_file(file).items()}
        if not sharded:  # one file, which loaders read instead of any index: the vision tower joins it
            tensors.update(vision)
        save_file(tensors, file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file.name))
    if sharded:
        if vision:
            save_file(vision, path / VISION_FILE, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(vision, VISION_FILE))
        index = json.loads((path / INDEX_FILE).read_text())
        index["weight_map"] = dict(sorted(weight_map.items()))
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2))
    shutil.copy(source / "config.json", path / "config.json")
    return sorted(vision)
