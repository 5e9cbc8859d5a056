"""The shipped architecture config (package data, no weights) is Qwen3.5-122B-A10B's published shape
(sources: docs/model_configs.md), loads in transformers as the real checkpoints do, and counts to the
parameters the name promises."""

from __future__ import annotations

import json

from transformers import AutoConfig, Qwen3_5MoeConfig

from grpo_launch.memory_plan import model_counts
from grpo_launch_qwen35_122b import PROFILE

TEXT = {
    "num_hidden_layers": 48,
    "hidden_size": 3072,
    "vocab_size": 248320,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 1024,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 64,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
}


def test_the_shipped_config_holds_the_published_values() -> None:
    assert PROFILE.architecture is not None
    raw = json.loads((PROFILE.architecture / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and raw["model_type"] == "qwen3_5_moe"
    text = raw["text_config"]
    assert {key: text[key] for key in TEXT} == TEXT
    # 3 Gated DeltaNet layers : 1 gated attention layer, twelve times.
    assert text["layer_types"] == (["linear_attention"] * 3 + ["full_attention"]) * 12
    assert raw["vision_config"]["out_hidden_size"] == text["hidden_size"]  # the merger feeds the embeddings
    assert PROFILE.num_experts == text["num_experts"]


def test_transformers_loads_it_as_the_checkpoints_class() -> None:
    config = AutoConfig.from_pretrained(PROFILE.architecture)
    assert isinstance(config, Qwen3_5MoeConfig)
    assert {key: getattr(config.text_config, key) for key in TEXT} == TEXT
    assert config.text_config.layer_types.count("full_attention") == 12
    assert config.vision_config.depth == 27


def test_it_counts_122b_parameters_228_gib_in_bf16() -> None:
    counts = model_counts(str(PROFILE.architecture))
    assert 122.0e9 < counts.total < 123.0e9, counts.total
    assert counts.layer_experts == 256 * 3 * 3072 * 1024  # gate, up, down of every routed expert
    assert 228 < counts.total * 2 / 2**30 < 229  # bf16 weights, GiB (245 GB)
    assert counts.embedding == counts.output == 248320 * 3072  # untied
