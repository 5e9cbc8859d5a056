"""grpo_device."""

from grpo_device.version import __version__

__all__ = ["__version__"]
