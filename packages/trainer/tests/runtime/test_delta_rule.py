"""The start-time check for FLA's gated delta-rule backward on Hopper (fla issue 640), which stopped
the 35B-shaped run on an H100 at its first update (docs/benchmarks.md, "Real shapes"). This machine
has no GPU: the facts a CUDA device would give are stood in for; the rule and its wiring into
`make_backend` are the product's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import grpo_config
from grpo_trainer.backends import check_delta_rule, delta_rule, make_backend

H100_TRITON_36 = delta_rule.KernelFacts(hopper=True, triton=(3, 6, 0), fla=True, tilelang=False)


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({}, True),
        ({"tilelang": True}, False),  # FLA's TileLang backend takes the gated backward
        ({"triton": (3, 7, 1)}, False),
        ({"triton": (3, 3, 1)}, False),
        ({"triton": None}, False),
        ({"hopper": False}, False),  # Ampere, Blackwell: FLA's Triton kernels are fine
        ({"fla": False}, False),  # transformers' and megatron-core's torch rule
    ],
)
def test_the_gated_backward_is_refused_only_where_fla_refuses_it(change: dict, refused: bool) -> None:
    found = dataclasses.replace(H100_TRITON_36, **change)
    problem = delta_rule.backward_problem(found, torch_delta_rule=False)
    assert (problem is not None) == refused
    if refused:
        assert "Triton 3.6.0" in problem and "tilelang" in problem and "deterministic_mode=true" in problem
    assert delta_rule.backward_problem(found, torch_delta_rule=True) is None
    assert delta_rule.backward_problem(None, torch_delta_rule=False) is None  # not a CUDA device


def test_versions_compare_by_their_release_numbers() -> None:
    assert delta_rule.version_of("3.6.0") == (3, 6, 0) < (3, 7, 1) <= delta_rule.version_of("3.7.1+git1a2b")
    assert delta_rule.facts(torch.device("cpu")) is None


def test_make_backend_refuses_before_loading_weights(tiny_model_dir, monkeypatch) -> None:
    """The tiny Qwen3.5 has Gated DeltaNet layers: on an H100 with Triton 3.6 and no tilelang the
    backend is refused before any weight loads, unless megatron-core's torch rule is asked for."""
    monkeypatch.setattr(delta_rule, "facts", lambda device: H100_TRITON_36)
    loads = []
    monkeypatch.setattr("grpo_trainer.backends.torch_backend.load_causal_lm", lambda *a, **k: loads.append(a))
    cfg = grpo_config.load({"actor": {"model_path": str(tiny_model_dir)}, "rollout": {"engine": "hf"}})
    with pytest.raises(ValueError, match="cannot be trained on this Hopper GPU"):
        make_backend(cfg, device=torch.device("cpu"))
    assert loads == []
    megatron = grpo_config.load(
        {"actor": {"model_path": str(tiny_model_dir), "backend": "megatron"}, "rollout": {"engine": "vllm"}}
    )
    with pytest.raises(ValueError, match="cannot be trained on this Hopper GPU"):
        check_delta_rule(megatron, torch.device("cpu"))
    torch_rule = grpo_config.load(
        grpo_config.to_dict(megatron), ['actor.megatron.override_transformer_config={"deterministic_mode": true}']
    )
    check_delta_rule(torch_rule, torch.device("cpu"))
