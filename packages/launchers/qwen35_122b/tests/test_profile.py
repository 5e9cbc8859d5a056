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


def test_deltas_name_only_what_differs() -> None:
    assert PROFILE.model_id == "Qwen/Qwen3.5-122B-A10B" and COMMON["device"] == {"nnodes": 4}
    assert _keys(dict(PROFILE.devices["gpu"].config)) == {
        "device.devices_per_node",
        "parallel.pp",
        "parallel.ep",
        "rollout.tensor_parallel_size",
        "actor.megatron.moe_router_load_balancing_type",
        "actor.megatron.apply_rope_fusion",
    }
    assert _keys(dict(PROFILE.devices["npu"].config)) == {
        "device.devices_per_node",
        "device.expandable_segments",
        "parallel.pp",
        "parallel.ep",
        "rollout.tensor_parallel_size",
        "actor.log_prob_micro_batch_size_per_device",
        "checkpoint.strict",
    }
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
        assert len(path.read_text().splitlines()) < 120, f"{path.name} is not thin"
    functions = [
        n for n in ast.walk(ast.parse((SRC / "cli.py").read_text())) if isinstance(n, ast.FunctionDef)
    ]
    assert [f.name for f in functions] == ["main"]
