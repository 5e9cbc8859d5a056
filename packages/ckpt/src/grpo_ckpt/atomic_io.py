"""Durable file writes: temp file + fsync + rename + directory fsync.

After `atomic_write_bytes` returns, a crash at any point leaves either the old file or the new one,
never a mix, and the rename itself survives a power loss (the directory entry is fsynced too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo_ckpt.json_safe import SafeJSONEncoder

__all__ = ["atomic_write_bytes", "atomic_write_json", "fsync_dir", "fsync_file", "read_json"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON (through SafeJSONEncoder, so it never fails on odd values)."""
    text = json.dumps(obj, cls=SafeJSONEncoder, indent=2)
    atomic_write_bytes(path, text.encode("utf-8") + b"\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
