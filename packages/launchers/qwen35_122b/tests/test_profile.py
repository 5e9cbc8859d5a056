"""The 122B profile is a table: common values once, per-device deltas naming only what differs, and
no code of its own (the machinery lives in grpo_launch)."""

from __future__ import annotations

import ast
from pathlib import Path

from grpo_launch_qwen35_122b import PROFILE
from grpo_launch_qwen35_122b.profile import COMMON

SRC = Path(__file__).resolve().parents[1] / "src" / "grpo_launch_qwen35_122b"


def _keys(tree: object, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix.rstrip(".")}
    return set().union(*(_keys(v, f"{prefix}{k}.") for k, v in tree.items()))


def _value(tree: dict, dotted: str) -> object:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_deltas_name_only_what_differs() -> None:
    """A delta holds only values the other device does not share (shared ones live in COMMON once);
    the values themselves are held to the seed recipes by tests/test_profiles_match_recipes.py."""
    gpu, npu = (dict(PROFILE.devices[d].config) for d in ("gpu", "npu"))
    for delta in (gpu, npu):
        assert not _keys(delta) & _keys(COMMON)
    shared = _keys(gpu) & _keys(npu)
    assert shared and all(_value(gpu, key) != _value(npu, key) for key in shared), shared
    assert dict(PROFILE.devices["npu"].env) == {
        "PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:0.8",
        "HCCL_CONNECT_TIMEOUT": "5400",
        "HCCL_BUFFSIZE": "300",
    }
    assert not PROFILE.devices["gpu"].env


def test_package_is_thin_and_independent() -> None:
    for path in SRC.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert not any(str(name).startswith("grpo_launch_qwen35_35b") for name in imported), path
        assert len(path.read_text().splitlines()) < 140, f"{path.name} is not thin"
    functions = [
        n for n in ast.walk(ast.parse((SRC / "cli.py").read_text())) if isinstance(n, ast.FunctionDef)
    ]
    assert [f.name for f in functions] == ["main"]
