"""The public surface of grpo_launch is deliberate: changing it means changing this list."""

from __future__ import annotations

import subprocess
import sys

import grpo_launch

EXPECTED = [
    "DataPlan",
    "DeviceDelta",
    "LaunchError",
    "LaunchPlan",
    "LaunchProfile",
    "__version__",
    "configure_logging",
    "deep_merge",
    "plan_full",
    "plan_tiny",
    "run_launcher",
    "tiny_preset",
]


def test_all_is_frozen_and_every_name_resolves() -> None:
    assert sorted(grpo_launch.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(grpo_launch, name) is not None, name


def test_the_tiny_reward_loads_without_torch() -> None:
    """Reward worker processes import the tiny task's `score` by its custom_fn string: that must not
    pull in torch (grpo_device), Ray or transformers."""
    code = (
        "import sys; from grpo_trainer.rewards import load_custom_fn; "
        "load_custom_fn('grpo_tiny.task:score'); "
        "print(sorted(m for m in ('torch', 'ray', 'transformers', 'grpo_device') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
