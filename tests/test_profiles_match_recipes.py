"""Each launch profile carries its seed verl recipe's values (tests/verl_recipes/): every setting a
recipe line maps to holds the recipe's value in the profile, unless the profile lists the key in its
recipe_differences with a reason. Refused recipe lines must be listed there too when the profile
differs from them (the refusal test is test_verl_recipes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import grpo_config
from grpo_config.from_verl import convert, overrides_from_script
from grpo_launch_qwen35_35b import PROFILE as PROFILE_35B
from grpo_launch_qwen35_122b import PROFILE as PROFILE_122B

RECIPES = Path(__file__).parent / "verl_recipes"
CASES = {
    "qwen35_35b_gpu": (PROFILE_35B, "gpu"),
    "qwen35_35b_npu": (PROFILE_35B, "npu"),
    "qwen35_122b_gpu": (PROFILE_122B, "gpu"),
    "qwen35_122b_npu": (PROFILE_122B, "npu"),
}


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and not key.endswith(("_config", "engine_kwargs")):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _lookup(tree: dict, dotted: str) -> object:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


@pytest.mark.parametrize("recipe", sorted(CASES))
def test_profile_holds_its_recipe_values(recipe: str) -> None:
    profile, device = CASES[recipe]
    differences = profile.differences_for(device)
    cfg = grpo_config.load(profile.config_for(device), num_experts=profile.num_experts)
    ours = grpo_config.to_dict(cfg)
    conversion = convert(overrides_from_script((RECIPES / f"{recipe}.txt").read_text()))
    theirs = _leaves(conversion.settings)
    unexplained = {
        key: (_lookup(ours, key), value)
        for key, value in theirs.items()
        if _lookup(ours, key) != value and key not in differences
    }
    assert not unexplained, f"{profile.launcher} {device} differs from {recipe} without a reason: {unexplained}"
    # A listed difference is a real one (or a refused recipe line), with a reason.
    for key, reason in differences.items():
        assert reason.strip(), key
        if key in theirs:
            assert _lookup(ours, key) != theirs[key], f"{key} is listed as a difference but equals the recipe"


def test_refused_recipe_values_are_listed_as_differences() -> None:
    """use_remove_padding=True in the 35B NPU recipe is refused; the profile says so."""
    assert "actor.use_remove_padding" in PROFILE_35B.differences_for("npu")
    assert PROFILE_35B.config_for("npu")["actor"]["use_remove_padding"] is False
