"""grpo_launch_qwen35_35b."""

from grpo_launch_qwen35_35b.version import __version__

__all__ = ["__version__"]
