"""grpo_launch_qwen35_122b."""

from grpo_launch_qwen35_122b.version import __version__

__all__ = ["__version__"]
