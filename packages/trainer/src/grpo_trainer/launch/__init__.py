"""Shared launcher machinery: a model launcher package is a `LaunchProfile` plus a `main` that calls
`run_launcher(PROFILE, argv)`. The `prepare-data` command is `python -m grpo_trainer.launch.prepare_data`."""

from __future__ import annotations

from grpo_trainer.launch.cli import run_launcher
from grpo_trainer.launch.errors import LaunchError
from grpo_trainer.launch.logging_setup import configure_logging
from grpo_trainer.launch.plan import DataPlan, LaunchPlan, plan_full, plan_tiny
from grpo_trainer.launch.profile import DeviceDelta, LaunchProfile, deep_merge

__all__ = [
    "DataPlan",
    "DeviceDelta",
    "LaunchError",
    "LaunchPlan",
    "LaunchProfile",
    "configure_logging",
    "deep_merge",
    "plan_full",
    "plan_tiny",
    "run_launcher",
]
