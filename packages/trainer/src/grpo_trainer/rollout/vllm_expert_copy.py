"""Routed-expert tensors copied straight into vLLM's fused expert weights during a weight sync.

The derivation: docs/INTERNALS.md, `grpo_trainer.rollout.vllm_expert_copy`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

# `...layers.7.mlp.experts.12.gate_proj.weight` (HF / Megatron-Bridge export names, text or VL layout)
EXPERT_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# vLLM's unquantized MoE backends whose w13 / w2 are the checkpoint's values, unpermuted.
PLAIN_BACKENDS = ("TRITON", "BATCHED_TRITON")


@dataclass(kw_only=True)
class ExpertLayer:
    """One vLLM fused-MoE layer whose expert weights are written directly."""

    name: str  # the vLLM module's qualified name
    w13: torch.Tensor  # [E, 2F, H]
    w2: torch.Tensor  # [E, H, F]
    written: set[tuple[int, str]] = field(default_factory=set)  # (expert, projection) this sync

    @property
    def num_experts(self) -> int:
        return int(self.w13.shape[0])

    @property
    def ffn(self) -> int:
        return int(self.w2.shape[2])

    def slot(self, expert: int, projection: str) -> torch.Tensor:
        if projection == "down_proj":
            return self.w2[expert]
        start = 0 if projection == "gate_proj" else self.ffn
        return self.w13[expert, start : start + self.ffn]

    @property
    def complete(self) -> bool:
        return len(self.written) == 3 * self.num_experts

    def parameter_names(self) -> list[str]:
        return [f"{self.name}.w13_weight", f"{self.name}.w2_weight"]


def eligible(module: Any) -> bool:
    """Whether `module` is a vLLM fused-MoE layer whose expert weights are plain copies of the
    checkpoint's (see the module docstring)."""
    w13 = getattr(module, "_parameters", {}).get("w13_weight")
    w2 = getattr(module, "_parameters", {}).get("w2_weight")
    method = getattr(module, "quant_method", None)
    backend = getattr(getattr(method, "unquantized_backend", None), "name", None)
    moe = getattr(module, "moe_config", None)
    parallel = getattr(moe, "moe_parallel_config", None)
    if w13 is None or w2 is None or type(method).__name__ != "UnquantizedFusedMoEMethod":
        return False
    if backend not in PLAIN_BACKENDS or getattr(module, "expert_map", None) is not None:
        return False
    if parallel is None or getattr(parallel, "tp_size", None) != 1 or getattr(parallel, "ep_size", None) != 1:
        return False
    if not getattr(moe, "is_act_and_mul", False) or getattr(moe, "hidden_dim_unpadded", w13.shape[-1]) != w13.shape[-1]:
        return False
    return (
        w13.dim() == 3
        and w2.dim() == 3
        and w13.is_contiguous()  # ROCm pads the expert weights: a strided view
        and w2.is_contiguous()
        and w13.shape[0] == w2.shape[0]
        and w13.shape[1] == 2 * w2.shape[2]
        and w13.shape[2] == w2.shape[1]
    )


def find_expert_layers(model: torch.nn.Module) -> dict[int, ExpertLayer]:
    """The eligible fused-MoE layers of `model` by decoder layer index; {} when a layer index is
    ambiguous (two MoE layers under one index) or none is eligible."""
    found: dict[int, ExpertLayer] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        if "w13_weight" not in getattr(module, "_parameters", {}):
            continue
        match = _LAYER.search(name)
        if match is None:
            return {}
        index = int(match.group(1))
        if index in seen:
            return {}
        seen.add(index)
        if eligible(module):
            found[index] = ExpertLayer(name=name, w13=module.w13_weight.data, w2=module.w2_weight.data)
    return found


class ExpertCopier:
    """Copies the expert tensors of one sync into `layers`; everything else is handed back."""

    def __init__(self, layers: dict[int, ExpertLayer]) -> None:
        self.layers = layers
        for layer in layers.values():
            layer.written.clear()

    def take(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """Copy the tensors that belong to an eligible layer (one fused copy for all of them);
        return the others in order, for vLLM's loader."""
        rest: list[tuple[str, torch.Tensor]] = []
        targets: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        for name, tensor in tensors:
            match = EXPERT_NAME.search(name)
            layer = self.layers.get(int(match.group(1))) if match else None
            if match is None or layer is None:
                rest.append((name, tensor))
                continue
            expert, projection = int(match.group(2)), match.group(3)
            if expert >= layer.num_experts:
                raise ValueError(f"weight sync: {name} names expert {expert}; {layer.name} has {layer.num_experts}")
            slot = layer.slot(expert, projection)
            if tuple(tensor.shape) != tuple(slot.shape):
                raise ValueError(
                    f"weight sync: {name} has shape {tuple(tensor.shape)}; {layer.name} expects {tuple(slot.shape)}"
                )
            targets.append(slot)
            sources.append(tensor.to(slot.device))
            layer.written.add((expert, projection))
        if targets:
            torch._foreach_copy_(targets, sources)
        return rest

    def loaded_parameter_names(self) -> set[str]:
        """vLLM parameter names of the layers every expert tensor of which arrived."""
        return {name for layer in self.layers.values() if layer.complete for name in layer.parameter_names()}
