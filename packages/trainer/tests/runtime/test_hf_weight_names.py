"""HF checkpoint names: per-expert tensors into transformers' fused experts, and text-only names
into a vision-language checkpoint's layout (what a vLLM engine serving Qwen3.5's real checkpoints
is sent by a policy built from the language model alone)."""

from __future__ import annotations

import torch

from grpo_ckpt.vision_language import into_language_model_layout
from grpo_trainer.rollout.hf_weight_names import checkpoint_target


def test_text_only_names_go_under_the_language_model_and_the_rest_stay() -> None:
    assert into_language_model_layout("model.layers.3.mlp.experts.7.gate_proj.weight") == (
        "model.language_model.layers.3.mlp.experts.7.gate_proj.weight"
    )
    assert into_language_model_layout("model.embed_tokens.weight") == "model.language_model.embed_tokens.weight"
    assert into_language_model_layout("model.norm.weight") == "model.language_model.norm.weight"
    for unchanged in (
        "model.language_model.layers.0.linear_attn.A_log",
        "model.visual.blocks.0.attn.qkv.weight",
        "lm_head.weight",
    ):
        assert into_language_model_layout(unchanged) == unchanged


def test_a_per_expert_tensor_lands_in_its_slice_of_the_fused_experts() -> None:
    fused = {"m.experts.gate_up_proj": torch.zeros(4, 6, 3), "m.experts.down_proj": torch.zeros(4, 3, 3)}
    checkpoint_target("m.experts.2.up_proj.weight", fused).fill_(1.0)
    checkpoint_target("m.experts.1.down_proj.weight", fused).fill_(2.0)
    assert fused["m.experts.gate_up_proj"][2, 3:].eq(1).all() and fused["m.experts.gate_up_proj"].sum() == 9
    assert fused["m.experts.down_proj"][1].eq(2).all() and fused["m.experts.down_proj"].sum() == 18
    assert checkpoint_target("m.experts.9.up_proj.weight", fused) is None
