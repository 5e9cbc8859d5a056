"""The random-weight Qwen checkpoints the Megatron tests and benches load: written whole, loadable,
and with norm weights away from their defaults (so a wrong zero-centring shows in comparisons)."""

from __future__ import annotations

from pathlib import Path

import torch

from grpo_tiny import hf_models


def test_a_saved_random_model_loads_back_with_its_random_norms(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = hf_models.save_random_model(hf_models.qwen3_dense_config(num_hidden_layers=1), tmp_path / "m")
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    norm = model.model.norm.weight
    assert model.config.num_hidden_layers == 1 and not torch.allclose(norm, torch.ones_like(norm), atol=1e-3)


def test_the_qwen35_shape_alternates_three_delta_net_layers_and_one_attention_layer() -> None:
    config = hf_models.qwen35_moe_config(num_hidden_layers=8)
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
