"""Repository-wide test set-up: nothing that imports a package, so that each package's tests run in
an environment holding that package alone (`hatch run pkg-config:run`, ...). Fixtures that need a
package live beside the tests that use them (tests/conftest.py, packages/trainer/tests/conftest.py).
The test tiers are decided here."""

from __future__ import annotations

import pytest

# Test tiers (docs/TESTING.md, "Tiers"): `hatch run test` runs every test not marked `full`;
# `hatch run test-all` runs every test; .ci/run runs the two halves (`test`, then `-m full`).
# The end-to-end files below are tiered here, in one place: each of their tests is `full` unless
# FAST names it, which keeps one end-to-end run per path the launchers take (tiny text, tiny VL,
# Megatron on CPU ranks, vLLM on CPU) and the error contract's cheap cases in the fast tier.
FULL_FILES = (
    "tests/test_faults.py",
    "tests/test_launcher_layouts.py",
    "tests/test_tiny_train.py",
    "tests/test_vllm_grpo_loop.py",
    "tests/test_launch_tiny.py",
    "tests/test_launch_tiny_vl.py",
    "tests/test_launch_tiny_tool.py",
    "tests/test_vllm_replicas.py",
    "tests/test_verl_corpus.py",
    "tests/test_one_step_off.py",
    "tests/test_algorithms_train.py",
    "tests/test_wheel_install.py",
    "tests/test_vl_vllm.py",
    "packages/trainer/tests/megatron/test_layouts.py",
    "packages/trainer/tests/vllm/test_vllm_inprocess_sync.py",
)
FULL_TESTS = (
    "tests/test_ckpt_export_qwen35.py::test_megatron_weights_synced_into_a_vllm_replica_give_the_hf_greedy_tokens",
    "tests/test_multi_turn_train.py::test_one_step_off_rollout_workers_run_the_turns_and_a_resumed_run_goes_on",
)
FAST = (
    "tests/test_launch_tiny.py::test_tiny_preset_runs_to_completion[grpo-launch-35b]",  # the README's first command
    "tests/test_launch_tiny_vl.py::test_tiny_vl_preset_learns_and_exports_the_vision_tower",
    "tests/test_vllm_grpo_loop.py::test_tiny_grpo_loop_runs_three_steps_on_vllm",
    *(
        f"packages/trainer/tests/megatron/test_layouts.py::test_layout_{name}[ep2_dp2]"
        for name in (
            "log_probs_equal_world_size_one",
            "update_equals_world_size_one",
            "synced_weights_equal_world_size_one_on_every_rank",
            "strict_hf_export_equals_world_size_one",
        )
    ),
    "packages/trainer/tests/megatron/test_layouts.py::test_layout_context_parallel_is_refused_in_the_config",
    "packages/trainer/tests/megatron/test_layouts.py::test_layout_resume_with_the_other_optimizer_kind_is_refused",
    "tests/test_faults.py::test_a_bad_setting_or_path_is_one_line_and_exit_2",
    "tests/test_faults.py::test_a_checkpoint_past_the_last_step_is_refused",
)


def tier_of(nodeid: str) -> str:
    """"full" or "test" for a test's node id (relative to the repository root)."""
    if nodeid.startswith(FAST):
        return "test"
    return "full" if nodeid.startswith(FULL_TESTS) or nodeid.split("::", 1)[0] in FULL_FILES else "test"


def stale_tier_entries(nodeids: list[str]) -> list[str]:
    """Entries of FAST / FULL_TESTS whose file was collected but which name none of its tests (a
    renamed or removed test): the table must say what it tiers."""
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    return [
        entry
        for entry in (*FAST, *FULL_TESTS)
        if entry.split("::", 1)[0] in files and not any(nodeid.startswith(entry) for nodeid in nodeids)
    ]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if tier_of(item.nodeid) == "full":
            item.add_marker(pytest.mark.full)
    whole_files = not any("::" in arg for arg in config.args)  # a test picked by id leaves its file's others out
    stale = stale_tier_entries([item.nodeid for item in items]) if whole_files else []
    if stale:
        raise pytest.UsageError(f"conftest.py's test tiers name tests that do not exist: {stale}")
