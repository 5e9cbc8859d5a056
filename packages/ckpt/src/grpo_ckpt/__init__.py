"""grpo_ckpt: fallback-safe JSON, crash-safe checkpoints, strict HF export."""

from grpo_ckpt.errors import CheckpointCorruptError, CheckpointNotFoundError, StrictExportError
from grpo_ckpt.json_safe import SafeJSONEncoder, json_safe
from grpo_ckpt.manager import CheckpointManager, LoadedCheckpoint
from grpo_ckpt.manifest import verify
from grpo_ckpt.rng import capture_rng, restore_rng
from grpo_ckpt.version import __version__

__all__ = [
    "CheckpointCorruptError",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "LoadedCheckpoint",
    "SafeJSONEncoder",
    "StrictExportError",
    "__version__",
    "capture_rng",
    "json_safe",
    "restore_rng",
    "verify",
]
