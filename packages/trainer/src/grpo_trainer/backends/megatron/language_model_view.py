"""The language model of a vision-language checkpoint, as Megatron-Bridge's text-only bridge reads it.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.language_model_view`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import structlog

from grpo_ckpt.vision_language import LANGUAGE_MODEL_PREFIX

log = structlog.get_logger()

# Vision-language model types whose language model has a text-only model type in the bridge.
TEXT_MODEL_TYPES = {"qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM")}


def vision_language_config(model_path: str) -> dict[str, Any] | None:
    """The checkpoint's config.json when it is a vision-language model with a known text-only
    counterpart, else None."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if config.get("model_type") in TEXT_MODEL_TYPES and "text_config" in config and "vision_config" in config:
        return config
    return None


def text_only_name(name: str) -> str:
    """`model.language_model.X` -> `model.X`; others (the vision tower's `model.visual.*`,
    `lm_head.*`) unchanged."""
    if name.startswith(LANGUAGE_MODEL_PREFIX):
        return "model." + name.removeprefix(LANGUAGE_MODEL_PREFIX)
    return name


def write_text_config(config: dict[str, Any], directory: Path) -> Path:
    """A folder holding only the language model's config.json (what the bridge reads to pick its
    text-only bridge and provider)."""
    model_type, architecture = TEXT_MODEL_TYPES[config["model_type"]]
    text = {
        **config["text_config"],
        "model_type": model_type,
        "architectures": [architecture],
        "tie_word_embeddings": config.get("tie_word_embeddings", config["text_config"].get("tie_word_embeddings", False)),
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(text, indent=2))
    return directory


def open_language_model_bridge(auto_bridge: Any, model_path: str, *, config: dict[str, Any], **kwargs: Any) -> Any:
    """A text-only `AutoBridge` whose weights are those of the vision-language checkpoint at
    `model_path`, read in place (language model under text-only names)."""
    from megatron.bridge.models.hf_pretrained.state import SafeTensorsStateSource, StateDict

    text_dir = write_text_config(config, Path(tempfile.mkdtemp(prefix="grpo-language-model-")))
    bridge = auto_bridge.from_hf_pretrained(str(text_dir), **kwargs)
    checkpoint = SafeTensorsStateSource(model_path)
    bridge.hf_pretrained._state_dict_accessor = StateDict(language_model_source(checkpoint))
    log.info("megatron.vision_language_checkpoint", model_path=model_path, architecture=config.get("architectures"))
    return bridge


def language_model_source(source: Any) -> Any:
    """A Megatron-Bridge `StateSource` over `source`, its language-model tensors under text-only
    names."""
    from megatron.bridge.models.hf_pretrained.state import StateSource

    class LanguageModelSource(StateSource):
        def __init__(self) -> None:
            self.names = {text_only_name(key): key for key in source.get_all_keys()}

        def get_all_keys(self) -> list[str]:
            return list(self.names)

        def load_tensors(self, keys: list[str]) -> dict[str, Any]:
            loaded = source.load_tensors([self.names[key] for key in keys])
            back = {self.names[key]: key for key in keys}
            return {back[name]: tensor for name, tensor in loaded.items()}

    return LanguageModelSource()
