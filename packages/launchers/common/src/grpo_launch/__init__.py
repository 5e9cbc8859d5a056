"""grpo_launch: the launcher machinery every model launcher shares (command line, plan, dry run,
environment, logging set-up, data preparation) and the built-in `tiny` preset.

A model launcher package is a `LaunchProfile` plus a `main` that calls `run_launcher(PROFILE, argv)`.
The `prepare-data` command is `python -m grpo_launch.prepare_data`. Names load on first use, so
importing `grpo_tiny.task` (as reward worker processes do, through the tiny preset's
`reward.custom_fn`) does not pull in torch through grpo_device.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from grpo_launch.version import __version__

if TYPE_CHECKING:
    from grpo_launch.cli import run_launcher
    from grpo_launch.errors import LaunchError
    from grpo_launch.logging_setup import configure_logging
    from grpo_launch.plan import DataPlan, LaunchPlan, plan_full, plan_tiny
    from grpo_launch.presets import tiny_preset
    from grpo_launch.profile import DeviceDelta, LaunchProfile, deep_merge

_EXPORTS = {
    "DataPlan": "grpo_launch.plan",
    "DeviceDelta": "grpo_launch.profile",
    "LaunchError": "grpo_launch.errors",
    "LaunchPlan": "grpo_launch.plan",
    "LaunchProfile": "grpo_launch.profile",
    "configure_logging": "grpo_launch.logging_setup",
    "deep_merge": "grpo_launch.profile",
    "plan_full": "grpo_launch.plan",
    "plan_tiny": "grpo_launch.plan",
    "run_launcher": "grpo_launch.cli",
    "tiny_preset": "grpo_launch.presets",
}

__all__ = [
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grpo_launch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
