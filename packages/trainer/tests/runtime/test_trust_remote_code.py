"""actor.trust_remote_code reaches the model load: a checkpoint whose architecture lives in its own
Python files (config.json's auto_map, as hub models with custom code ship) loads only with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import grpo_config
from grpo_trainer.backends.torch_backend import TorchBackend

CONFIGURATION = """
from transformers import Qwen3Config


class RemoteTinyConfig(Qwen3Config):
    model_type = "grpo_remote_tiny"
"""
MODELING = """
from transformers import Qwen3ForCausalLM

from .configuration_remote_tiny import RemoteTinyConfig


class RemoteTinyForCausalLM(Qwen3ForCausalLM):
    config_class = RemoteTinyConfig
"""


@pytest.fixture(scope="module")
def remote_model(tmp_path_factory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("remote_tiny")
    config = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
    )
    Qwen3ForCausalLM(config).save_pretrained(path)
    (path / "configuration_remote_tiny.py").write_text(CONFIGURATION)
    (path / "modeling_remote_tiny.py").write_text(MODELING)
    data = json.loads((path / "config.json").read_text())
    data["model_type"] = "grpo_remote_tiny"
    data["architectures"] = ["RemoteTinyForCausalLM"]
    data["auto_map"] = {
        "AutoConfig": "configuration_remote_tiny.RemoteTinyConfig",
        "AutoModelForCausalLM": "modeling_remote_tiny.RemoteTinyForCausalLM",
    }
    (path / "config.json").write_text(json.dumps(data))
    return path


def _backend(path: Path, *overrides: str) -> TorchBackend:
    cfg = grpo_config.load(
        None, [f"actor.model_path={path}", "actor.use_kl_loss=false", "rollout.engine=hf", *overrides]
    )
    return TorchBackend.for_config(cfg, device=torch.device("cpu"))


def test_custom_code_loads_only_with_trust_remote_code(remote_model: Path) -> None:
    with pytest.raises(ValueError, match="trust_remote_code"):
        _backend(remote_model)
    backend = _backend(remote_model, "actor.trust_remote_code=true")
    assert type(backend.module).__name__ == "RemoteTinyForCausalLM"
