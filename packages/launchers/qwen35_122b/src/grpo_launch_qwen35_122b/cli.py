"""`grpo-launch-122b` (hatch: `launch-122b`). Options: `grpo-launch-122b --help`."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_launch import run_launcher
from grpo_launch_qwen35_122b.profile import PROFILE


def main(argv: Sequence[str] | None = None) -> int:
    return run_launcher(PROFILE, argv)
