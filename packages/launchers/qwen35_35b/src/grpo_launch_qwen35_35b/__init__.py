"""grpo_launch_qwen35_35b: GRPO on Qwen3.5-35B-A3B, one command per device."""

from grpo_launch_qwen35_35b.cli import main
from grpo_launch_qwen35_35b.profile import PROFILE
from grpo_launch_qwen35_35b.version import __version__

__all__ = ["PROFILE", "__version__", "main"]
