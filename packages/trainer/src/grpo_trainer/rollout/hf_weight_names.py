"""Where a tensor named as in an HF *checkpoint* lands in a transformers model's in-memory layout.

transformers 5 keeps the routed experts of its MoE models fused (`mlp.experts.gate_up_proj`
`[E, 2F, H]`, gate rows first, and `mlp.experts.down_proj` `[E, H, F]`) and converts at load time,
while checkpoints, vLLM and Megatron-Bridge's export name every expert on its own
(`mlp.experts.N.gate_proj.weight`, `...up_proj...`, `...down_proj...`). The rollout engine's
`update_weights` takes either spelling: a per-expert tensor is copied straight into its slice of the
fused parameter, so a sync needs no extra memory for restacking.
"""

from __future__ import annotations

import re

import torch

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<index>\d+)\.(?P<part>gate|up|down)_proj\.weight$")


def checkpoint_target(name: str, own: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The model tensor, or the view of a fused one, that checkpoint tensor `name` fills; None
    when the model has no such tensor."""
    if name in own:
        return own[name]
    match = _PER_EXPERT.match(name)
    if match is None:
        return None
    prefix, index, part = match["prefix"], int(match["index"]), match["part"]
    fused = own.get(f"{prefix}.down_proj" if part == "down" else f"{prefix}.gate_up_proj")
    if fused is None or fused.dim() != 3 or index >= fused.shape[0]:
        return None
    if part == "down":
        return fused[index]
    half = fused.shape[1] // 2
    return fused[index, :half] if part == "gate" else fused[index, half:]
