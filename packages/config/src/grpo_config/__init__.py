"""grpo_config."""

from grpo_config.version import __version__

__all__ = ["__version__"]
