"""grpo_launch_qwen35_122b: GRPO on Qwen3.5-122B-A10B, one command per device."""

from grpo_launch_qwen35_122b.cli import main
from grpo_launch_qwen35_122b.profile import PROFILE
from grpo_launch_qwen35_122b.version import __version__

__all__ = ["PROFILE", "__version__", "main"]
