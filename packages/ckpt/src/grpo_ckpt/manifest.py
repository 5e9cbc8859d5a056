"""`manifest.json`: the completion marker of a checkpoint, with every file's size and sha256.

It is written last, atomically, after every file it lists has been fsynced. A directory without a
valid manifest, or whose files no longer match the recorded sizes, is not a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from grpo_ckpt.atomic_io import atomic_write_json, read_json
from grpo_ckpt.errors import CheckpointCorruptError

__all__ = [
    "MANIFEST_NAME",
    "FileRecord",
    "build_manifest",
    "check_complete",
    "hash_files",
    "list_payload_files",
    "read_manifest",
    "verify",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
FORMAT = "grpo-ckpt"
VERSION = 1
_CHUNK = 16 << 20
_TEMP_FILE = re.compile(r"^\..+\.tmp-\d+$")  # atomic_io.atomic_write_bytes

FileRecord = dict[str, Any]  # {"size": int, "sha256": str}


def list_payload_files(step_dir: Path) -> list[str]:
    """Relative paths of every file in the checkpoint except the manifest and the temp files of
    `atomic_io` (`.<name>.tmp-<pid>`). Other hidden files are payload: torch's distributed
    checkpoint keeps its index in `.metadata`."""
    found = []
    for path in step_dir.rglob("*"):
        rel = path.relative_to(step_dir)
        if path.is_file() and rel.as_posix() != MANIFEST_NAME and not _TEMP_FILE.match(path.name):
            found.append(rel.as_posix())
    return sorted(found)


def _hash_and_sync(path: Path) -> FileRecord:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    size = 0
    with open(path, "rb") as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
            size += n
        os.fsync(handle.fileno())  # durable before the manifest can name it
    return {"size": size, "sha256": digest.hexdigest()}


def hash_files(step_dir: Path, rel_paths: Iterable[str], *, threads: int = 4) -> dict[str, FileRecord]:
    """sha256 + size of each file, fsyncing it too. hashlib releases the GIL, so threads overlap."""
    rel_paths = list(rel_paths)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(rel_paths)))) as pool:
        records = pool.map(lambda rel: _hash_and_sync(step_dir / rel), rel_paths)
        return dict(zip(rel_paths, records, strict=True))


def build_manifest(*, step: int, files: dict[str, FileRecord], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "total_bytes": sum(r["size"] for r in files.values()),
        "files": dict(sorted(files.items())),
        **extra,
    }


def write_manifest(step_dir: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(step_dir / MANIFEST_NAME, manifest)


def read_manifest(step_dir: Path) -> dict[str, Any]:
    """The parsed manifest; CheckpointCorruptError when it is absent or malformed."""
    path = Path(step_dir) / MANIFEST_NAME
    if not path.is_file():
        raise CheckpointCorruptError(f"{step_dir} has no {MANIFEST_NAME}: the save did not finish")
    try:
        manifest = read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorruptError(f"{path} is unreadable ({exc}); the checkpoint is not usable") from exc
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or manifest.get("format") != FORMAT
        or not isinstance(manifest.get("step"), int)
        or not all(isinstance(r, dict) and {"size", "sha256"} <= r.keys() for r in files.values())
    ):
        raise CheckpointCorruptError(f"{path} is not a {FORMAT} manifest (missing format/step/files)")
    if manifest.get("version", 0) > VERSION:
        raise CheckpointCorruptError(
            f"{path} has manifest version {manifest['version']}, newer than this grpo_ckpt ({VERSION}): "
            "upgrade grpo-ckpt to load it"
        )
    return manifest


def check_complete(step_dir: Path) -> str | None:
    """None when the checkpoint is complete (manifest valid, every file present at its size), else why not.

    Cheap (stat only): use `verify` to also compare contents.
    """
    try:
        manifest = read_manifest(step_dir)
    except CheckpointCorruptError as exc:
        return str(exc)
    for rel, record in manifest["files"].items():
        path = Path(step_dir) / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != record["size"]:
            return f"{rel} is {path.stat().st_size} bytes, manifest says {record['size']}"
    return None


def verify(step_dir: Path, *, threads: int = 4, only: Iterable[str] | None = None) -> dict[str, Any]:
    """Re-hash every file listed in the manifest; CheckpointCorruptError listing each mismatch.

    `only` restricts the check to some files (ranks split the work); returns the manifest.
    """
    step_dir = Path(step_dir)
    manifest = read_manifest(step_dir)
    wanted = manifest["files"] if only is None else {k: manifest["files"][k] for k in only}
    present = {rel for rel in wanted if (step_dir / rel).is_file()}
    problems = [f"{rel}: missing" for rel in sorted(set(wanted) - present)]
    actual = hash_files(step_dir, sorted(present), threads=threads)
    for rel in sorted(present):
        expected, got = wanted[rel], actual[rel]
        if got["size"] != expected["size"]:
            problems.append(f"{rel}: {got['size']} bytes, manifest says {expected['size']} (truncated?)")
        elif got["sha256"] != expected["sha256"]:
            problems.append(f"{rel}: sha256 {got['sha256'][:16]}..., manifest says {expected['sha256'][:16]}...")
    if problems:
        raise CheckpointCorruptError(
            f"checkpoint {step_dir} is corrupt ({len(problems)} of {len(wanted)} files differ from "
            f"{MANIFEST_NAME}):\n  " + "\n  ".join(problems) + "\nDo not resume from it: resume from an older "
            f"one with checkpoint.resume=<its global_step_N directory>{_older(step_dir)}, or delete {step_dir} "
            "so that checkpoint.resume=auto picks the previous complete one."
        )
    return manifest


def _older(step_dir: Path) -> str:
    """`" (e.g. <path>)"` naming the newest complete checkpoint before `step_dir`, or ``."""
    from grpo_ckpt.manager import CheckpointManager  # manager imports this module

    steps = CheckpointManager(step_dir.parent).step_dirs()  # newest first
    step = next((number for number, path in steps if path == step_dir), None)
    if step is None:
        return ""
    for number, path in steps:
        if number < step and check_complete(path) is None:
            return f" (e.g. checkpoint.resume={path})"
    return ""
