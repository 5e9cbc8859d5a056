"""The random-weight Qwen checkpoints the tests and benches load: written whole, loadable,
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


def test_the_vllm_tests_qwen3_is_seeded_and_sized_for_vllm_on_cpu(tmp_path: Path) -> None:
    """head_dim 32 (vLLM's CPU backend rejects less), the tokenizer saved beside the weights, the
    same seed the same weights, and its own pad and eos tokens."""
    from transformers import AutoConfig, AutoTokenizer

    model, tokenizer = hf_models.build_tiny_qwen3(tmp_path / "a", seed=3, hidden_size=64)
    again, _ = hf_models.build_tiny_qwen3(tmp_path / "b", seed=3, hidden_size=64, tokenizer=tokenizer)
    other, _ = hf_models.build_tiny_qwen3(tmp_path / "c", seed=4, hidden_size=64, tokenizer=tokenizer)
    config = AutoConfig.from_pretrained(tmp_path / "a")
    assert (config.head_dim, config.num_attention_heads, config.vocab_size) == (32, 2, len(tokenizer))
    assert AutoTokenizer.from_pretrained(tmp_path / "a").eos_token == "<|endoftext|>" != tokenizer.pad_token
    weights = [dict(m.state_dict())["model.embed_tokens.weight"] for m in (model, again, other)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
