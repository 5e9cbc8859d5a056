"""The 35B profile is a table: common values once, per-device deltas naming only what differs, and
no code of its own (the machinery lives in grpo_launch)."""

from __future__ import annotations

import ast
from pathlib import Path

from grpo_launch_qwen35_35b import PROFILE
from grpo_launch_qwen35_35b.profile import COMMON

SRC = Path(__file__).resolve().parents[1] / "src" / "grpo_launch_qwen35_35b"


def _keys(tree: object, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix.rstrip(".")}
    return set().union(*(_keys(v, f"{prefix}{k}.") for k, v in tree.items()))


def test_deltas_name_only_what_differs() -> None:
    assert PROFILE.model_id == "Qwen/Qwen3.5-35B-A3B" and PROFILE.dataset == "geo3k"
    assert _keys(dict(PROFILE.devices["gpu"].config)) == {
        "device.devices_per_node",
        "parallel.pp",
        "rollout.tensor_parallel_size",
    }
    assert _keys(dict(PROFILE.devices["npu"].config)) == {
        "device.devices_per_node",
        "parallel.pp",
        "rollout.tensor_parallel_size",
        "checkpoint.strict",
    }
    assert not PROFILE.devices["gpu"].env and not PROFILE.devices["npu"].env
    # Shared values are not repeated in a delta.
    for delta in PROFILE.devices.values():
        assert not _keys(dict(delta.config)) & _keys(COMMON)


def test_common_recipe_values() -> None:
    assert COMMON["parallel"] == {"tp": 2, "ep": 8, "etp": 1, "cp": 1, "sequence_parallel": True}
    assert COMMON["data"] == {"max_prompt_length": 1024, "max_response_length": 2048, "train_batch_size": 512}
    actor = COMMON["actor"]
    assert (actor["lr"], actor["ppo_mini_batch_size"], actor["kl_loss_coef"], actor["kl_loss_type"]) == (
        1e-6,
        128,
        0.01,
        "low_var_kl",
    )
    assert COMMON["rollout"]["n"] == 5 and COMMON["checkpoint"]["save_freq"] == 20
    assert (COMMON["test_freq"], COMMON["total_epochs"]) == (5, 15)


def test_package_is_thin_and_independent() -> None:
    for path in SRC.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert not any(str(name).startswith("grpo_launch_qwen35_122b") for name in imported), path
        assert len(path.read_text().splitlines()) < 120, f"{path.name} is not thin"
    functions = [
        n for n in ast.walk(ast.parse((SRC / "cli.py").read_text())) if isinstance(n, ast.FunctionDef)
    ]
    assert [f.name for f in functions] == ["main"]
