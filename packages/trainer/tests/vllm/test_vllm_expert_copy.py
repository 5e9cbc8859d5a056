"""`vllm_expert_copy`: per-expert HF tensors into fused [E, 2F, H] / [E, H, F] storage (pure torch:
the layout vLLM's Triton MoE reads; the GPU run checks it against vLLM itself)."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.rollout.vllm_expert_copy import (
    EXPERT_NAME,
    ExpertCopier,
    ExpertLayer,
    eligible,
    find_expert_layers,
)

E, F, H = 4, 3, 5


def _layer() -> ExpertLayer:
    return ExpertLayer(name="language_model.model.layers.1.mlp.experts", w13=torch.zeros(E, 2 * F, H), w2=torch.zeros(E, H, F))


def _expert_tensors(prefix: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for e in range(E):
        out[f"{prefix}.{e}.gate_proj.weight"] = torch.randn(F, H, generator=g)
        out[f"{prefix}.{e}.up_proj.weight"] = torch.randn(F, H, generator=g)
        out[f"{prefix}.{e}.down_proj.weight"] = torch.randn(H, F, generator=g)
    return out


def test_expert_tensors_land_in_vllm_s_w13_and_w2_layout_and_the_rest_is_handed_back():
    layer = _layer()
    copier = ExpertCopier({1: layer})
    experts = _expert_tensors("model.language_model.layers.1.mlp.experts", seed=0)
    other = [("model.language_model.layers.1.mlp.gate.weight", torch.ones(E, H)), ("model.layers.2.mlp.experts.0.up_proj.weight", torch.ones(F, H))]
    items = list(experts.items())
    rest = copier.take(items[:5] + other[:1])
    assert [name for name, _ in rest] == [other[0][0]]
    assert not copier.loaded_parameter_names()  # 5 of 12 tensors so far
    rest = copier.take(items[5:] + other[1:])
    assert [name for name, _ in rest] == [other[1][0]]  # layer 2 has no eligible expert layer
    for e in range(E):
        prefix = f"model.language_model.layers.1.mlp.experts.{e}"
        assert torch.equal(layer.w13[e], torch.cat([experts[f"{prefix}.gate_proj.weight"], experts[f"{prefix}.up_proj.weight"]]))
        assert torch.equal(layer.w2[e], experts[f"{prefix}.down_proj.weight"])
    assert copier.loaded_parameter_names() == {f"{layer.name}.w13_weight", f"{layer.name}.w2_weight"}


def test_a_tensor_of_the_wrong_shape_or_expert_raises_naming_it():
    copier = ExpertCopier({0: _layer()})
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts.1.down_proj.weight has shape \(3, 5\)"):
        copier.take([("model.layers.0.mlp.experts.1.down_proj.weight", torch.ones(F, H))])
    with pytest.raises(ValueError, match="names expert 4"):
        copier.take([("model.layers.0.mlp.experts.4.gate_proj.weight", torch.ones(F, H))])


def test_names_matched_are_the_per_expert_export_names_only():
    assert EXPERT_NAME.search("model.layers.3.mlp.experts.255.down_proj.weight").groups() == ("3", "255", "down_proj")
    assert EXPERT_NAME.search("model.language_model.layers.0.mlp.experts.7.gate_proj.weight")
    assert not EXPERT_NAME.search("model.layers.3.mlp.shared_expert.down_proj.weight")
    assert not EXPERT_NAME.search("model.layers.3.mlp.experts.gate_up_proj")  # fused 3-D: vLLM's loader


def test_a_module_without_vllm_s_plain_triton_layout_is_not_eligible():
    moe = torch.nn.Module()
    moe.w13_weight = torch.nn.Parameter(torch.zeros(E, 2 * F, H))
    moe.w2_weight = torch.nn.Parameter(torch.zeros(E, H, F))
    assert not eligible(moe)  # no quant method / backend: vLLM's loader keeps it
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].experts = moe
    assert find_expert_layers(model) == {}
