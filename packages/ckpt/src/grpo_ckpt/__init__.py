"""grpo_ckpt: fallback-safe JSON, crash-safe checkpoints, strict HF export.

Megatron-Bridge is imported lazily (only `export_hf` callers and `import_megatron_bridge` need it).
"""

from grpo_ckpt.errors import CheckpointCorruptError, CheckpointNotFoundError, StrictExportError
from grpo_ckpt.export import ExportReport, export_hf, export_hf_torch
from grpo_ckpt.json_safe import SafeJSONEncoder, json_safe
from grpo_ckpt.manager import CheckpointManager, LoadedCheckpoint
from grpo_ckpt.manifest import verify
from grpo_ckpt.megatron_compat import import_megatron_bridge
from grpo_ckpt.rng import capture_rng, restore_rng
from grpo_ckpt.run_lock import FolderInUseError, RunLock, holder_of
from grpo_ckpt.version import __version__

__all__ = [
    "CheckpointCorruptError",
    "CheckpointManager",
    "CheckpointNotFoundError",
    "ExportReport",
    "FolderInUseError",
    "LoadedCheckpoint",
    "RunLock",
    "SafeJSONEncoder",
    "StrictExportError",
    "__version__",
    "capture_rng",
    "export_hf",
    "export_hf_torch",
    "holder_of",
    "import_megatron_bridge",
    "json_safe",
    "restore_rng",
    "verify",
]
