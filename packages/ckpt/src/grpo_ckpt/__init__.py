"""grpo_ckpt."""

from grpo_ckpt.version import __version__

__all__ = ["__version__"]
