"""The test tiers of the root conftest.py (docs/TESTING.md, "Tiers"): `hatch run test` keeps one
end-to-end run per path the launchers take and the unit tests; `hatch run test-all` adds the rest."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
assert _spec is not None and _spec.loader is not None
tiers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiers)


def test_each_launcher_path_keeps_one_end_to_end_run_in_the_fast_tier() -> None:
    paths = {
        "tiny text, the README's first command": "tests/test_launch_tiny.py::test_tiny_preset_runs_to_completion[grpo-launch-35b]",
        "tiny VL": "tests/test_launch_tiny_vl.py::test_tiny_vl_preset_learns_and_exports_the_vision_tower",
        "Megatron on CPU ranks": "packages/trainer/tests/megatron/test_layouts.py::test_layout_update_equals_world_size_one[ep2_dp2]",
        "vLLM on CPU": "tests/test_vllm_grpo_loop.py::test_tiny_grpo_loop_runs_three_steps_on_vllm",
    }
    assert {path: tiers.tier_of(nodeid) for path, nodeid in paths.items()} == dict.fromkeys(paths, "test")


def test_the_rest_of_an_end_to_end_file_and_named_tests_are_full_and_other_files_fast() -> None:
    assert tiers.tier_of("tests/test_launch_tiny.py::test_tiny_preset_runs_to_completion[grpo-launch-122b]") == "full"
    assert tiers.tier_of("packages/trainer/tests/megatron/test_layouts.py::test_layout_update_equals_world_size_one[pp2]") == "full"
    assert tiers.tier_of(tiers.FULL_TESTS[0]) == "full"
    assert tiers.tier_of("tests/test_ckpt_export_qwen35.py::test_another") == "test"
    assert tiers.tier_of("packages/config/tests/test_aliases.py::test_x") == "test"


def test_a_tier_entry_naming_no_collected_test_of_its_file_is_stale() -> None:
    collected = [
        "tests/test_launch_tiny.py::test_tiny_preset_runs_to_completion[grpo-launch-35b]",
        "tests/test_faults.py::test_renamed",
    ]
    stale = tiers.stale_tier_entries(collected)
    assert "tests/test_faults.py::test_a_bad_setting_or_path_is_one_line_and_exit_2" in stale
    assert not any(entry.startswith(("tests/test_launch_tiny.py", "tests/test_vl_vllm.py")) for entry in stale)
