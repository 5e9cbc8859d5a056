"""Built-in presets: functions that build what a run needs and return its config as data. The
tiny task's reward reaches the run through that config (`reward.custom_fn`), never through an
import in the trainer."""

from grpo_launch.presets.tiny import tiny_preset
from grpo_launch.presets.tiny_tool import tiny_tool_preset
from grpo_launch.presets.tiny_vl import tiny_vl_preset
from grpo_tiny.task import DATA_SOURCE as TINY_DATA_SOURCE

__all__ = ["TINY_DATA_SOURCE", "tiny_preset", "tiny_tool_preset", "tiny_vl_preset"]
