"""Built-in presets. Importing this registers the tiny task's reward ("grpo/tiny")."""

from grpo_trainer.presets.tiny import tiny_preset
from grpo_trainer.presets.tiny_task import DATA_SOURCE as TINY_DATA_SOURCE

__all__ = ["TINY_DATA_SOURCE", "tiny_preset"]
