"""grpo_trainer."""

from grpo_trainer.version import __version__

__all__ = ["__version__"]
