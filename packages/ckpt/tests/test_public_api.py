from __future__ import annotations

import subprocess
import sys

import grpo_ckpt


def test_public_api_is_frozen() -> None:
    assert sorted(grpo_ckpt.__all__) == [
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
    assert all(hasattr(grpo_ckpt, name) for name in grpo_ckpt.__all__)


def test_import_does_not_pull_megatron_or_transformers() -> None:
    code = "import sys, grpo_ckpt; print(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'transformers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_errors_are_value_errors() -> None:
    for error in (grpo_ckpt.CheckpointCorruptError, grpo_ckpt.CheckpointNotFoundError, grpo_ckpt.StrictExportError):
        assert issubclass(error, ValueError)
