"""Can this machine train Qwen3.5's Gated DeltaNet layers? Checked before any weight is loaded.

FLA 0.6 (the delta-rule kernels megatron-core and transformers call) refuses the gated backward on
Hopper GPUs with Triton >= 3.4 and < 3.7.1 ("incorrect results", fla issue 640) unless its TileLang
backend takes the call (tilelang installed: requirements/gpu.lock pins it). Without this check the
refusal comes from inside the first update, minutes into a run (docs/benchmarks.md, "Real shapes").
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata

import torch

from grpo_device import DeviceKind, torch_device_module

Version = tuple[int, ...]


def version_of(text: str) -> Version:
    """The release numbers of a version string ("3.6.0+git1a2b" -> (3, 6, 0))."""
    match = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


@dataclass(frozen=True, kw_only=True)
class KernelFacts:
    hopper: bool  # compute capability 9.x
    triton: Version | None  # None: not installed
    fla: bool
    tilelang: bool


def facts(device: torch.device) -> KernelFacts | None:
    """The facts that decide it, for a CUDA `device`; None for any other device."""
    if device.type != DeviceKind.CUDA:
        return None

    def installed(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    try:
        triton: Version | None = version_of(metadata.version("triton"))
    except metadata.PackageNotFoundError:
        triton = None
    return KernelFacts(
        hopper=torch_device_module(DeviceKind.CUDA).get_device_capability(device)[0] == 9,
        triton=triton,
        fla=installed("fla"),
        tilelang=installed("tilelang"),
    )


def backward_problem(found: KernelFacts | None, *, torch_delta_rule: bool) -> str | None:
    """Why the gated delta-rule backward would stop here, with what to do; None when it runs.
    `torch_delta_rule`: the backend computes the rule in plain torch (megatron-core's
    `deterministic_mode`), so FLA's kernels are not used."""
    if found is None or torch_delta_rule or not (found.fla and found.hopper) or found.tilelang:
        return None
    if found.triton is None or not (3, 4) <= found.triton < (3, 7, 1):
        return None
    return (
        f"Qwen3.5's Gated DeltaNet layers cannot be trained on this Hopper GPU: FLA's gated delta-rule backward "
        f"refuses Triton {'.'.join(map(str, found.triton))} (>= 3.4.0 and < 3.7.1 give wrong gradients there, fla issue 640) unless "
        "tilelang is installed. Install tilelang (requirements/gpu.lock pins 0.1.9) or Triton >= 3.7.1; or, on the "
        "Megatron backend, set actor.megatron.override_transformer_config.deterministic_mode=true (megatron-core's "
        "pure-torch delta rule: correct, much slower)"
    )


def has_linear_attention(config: object) -> bool:
    """Whether a transformers config (text or vision-language) has Gated DeltaNet layers."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return "linear_attention" in (getattr(text, "layer_types", None) or ())
