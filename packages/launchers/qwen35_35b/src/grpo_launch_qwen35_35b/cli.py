"""`grpo-launch-35b` (hatch: `launch-35b`). Options: `grpo-launch-35b --help`."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_launch import run_launcher
from grpo_launch_qwen35_35b.profile import PROFILE


def main(argv: Sequence[str] | None = None) -> int:
    return run_launcher(PROFILE, argv)
