"""CheckpointManager: crash-safe save, retention, resume and load of training checkpoints.

The derivation: docs/INTERNALS.md, `grpo_ckpt.manager`.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from grpo_ckpt import manifest as mf
from grpo_ckpt import tensor_store
from grpo_ckpt.atomic_io import atomic_write_bytes, atomic_write_json, fsync_dir, read_json
from grpo_ckpt.dist_utils import all_gather_objects, barrier, rank_and_world
from grpo_ckpt.errors import CheckpointCorruptError, CheckpointNotFoundError, CheckpointSpaceError
from grpo_ckpt.json_safe import json_safe
from grpo_ckpt.rng import capture_rng
from grpo_ckpt.structure import flatten_state, merge_skeletons, tensor_keys, unflatten_state

log = structlog.get_logger()

__all__ = ["COMPONENTS", "CheckpointManager", "LoadedCheckpoint"]

COMPONENTS = ("model", "optimizer", "scheduler", "dataloader")
LATEST = "latest"
STEP_PREFIX = "global_step_"
_STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")


@dataclass(frozen=True, kw_only=True)
class LoadedCheckpoint:
    path: Path
    step: int
    model: dict[str, torch.Tensor] | None
    optimizer: dict[str, Any] | None
    scheduler: dict[str, Any] | None
    trainer_state: dict[str, Any]
    dataloader_state: dict[str, Any] | None
    rng: dict[str, Any] | None
    manifest: dict[str, Any]


class CheckpointManager:
    """Saves `global_step_N/` checkpoints under `root`; every rank calls `save` when distributed."""

    def __init__(self, root: str | Path, *, max_to_keep: int | None = None, hash_threads: int = 4) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(
                f"max_to_keep={max_to_keep}: must be None (keep all) or >= 1 (the newest complete "
                "checkpoint is never deleted); set checkpoint.max_to_keep accordingly"
            )
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self.hash_threads = hash_threads

    # ---- paths -------------------------------------------------------------------------------------
    def step_dir(self, step: int) -> Path:
        return self.root / f"{STEP_PREFIX}{step}"

    def step_dirs(self) -> list[tuple[int, Path]]:
        """All `global_step_N` directories (complete or not), newest step first."""
        if not self.root.is_dir():
            return []
        found = [
            (int(m.group(1)), p) for p in self.root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()
        ]
        return sorted(found, reverse=True)

    # ---- save --------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        *,
        model: dict[str, torch.Tensor] | None,
        optimizer: dict[str, Any] | None,
        scheduler: dict[str, Any] | None,
        trainer_state: dict[str, Any],
        dataloader_state: dict[str, Any] | None = None,
        transformer_config: Any = None,
        extra_files: dict[str, bytes] | None = None,
        manifest_extra: dict[str, Any] | None = None,
        writers: dict[str, Callable[[Path], None]] | None = None,
    ) -> Path:
        """Write a complete checkpoint for `step` and point `latest` at it. Captures RNG itself.

        Distributed: every rank calls this with its own shards (DTensors) of the same keys, or with
        plain tensors under keys of its own (a Megatron model-parallel rank's shards); rank 0's
        trainer_state, dataloader_state, transformer_config and extra files are the ones written.
        `manifest_extra` is merged into manifest.json (e.g. keys an HF export skipped).
        `writers`: state a library writes itself (Megatron's distributed checkpoint), name ->
        function called on every rank with the empty directory `global_step_N/<name>`; its files
        join the manifest like the others.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        rank, world = rank_and_world()
        step_dir = self.step_dir(step)
        started = time.perf_counter()
        trees = {
            "model": model,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "dataloader": dataloader_state,
        }
        # Refuse bad input before touching the disk (re-saving a step deletes the old one first).
        flat = {name: flatten_state(tree) for name, tree in trees.items() if tree is not None}
        for name in [*(extra_files or {}), *(writers or {})]:
            _check_extra_name(name)
        clashes = sorted(set(writers or {}) & {*COMPONENTS, "rng", "extra"})
        if clashes:
            raise ValueError(
                f"writers {clashes} would write into the checkpoint's own directories; name them otherwise"
            )
        problems = all_gather_objects(self._space_problem(step) if rank == 0 else None)
        if problems[0] is not None:  # every rank refuses, none waits in a collective
            raise CheckpointSpaceError(problems[0])
        if rank == 0:
            log.info("ckpt.save_start", step=step, path=str(step_dir))
            self._prepare_empty(step_dir)
        barrier()
        try:
            return self._save_into(
                step_dir,
                step,
                flat,
                trees,
                rank=rank,
                world=world,
                started=started,
                trainer_state=trainer_state,
                transformer_config=transformer_config,
                extra_files=extra_files,
                manifest_extra=manifest_extra,
                writers=writers,
            )
        except BaseException:
            if rank == 0 and step_dir.exists() and mf.check_complete(step_dir) is not None:
                # A partial folder is never taken for whole (it has no manifest), but it holds disk space
                # that a retry after a full disk needs.
                log.warning("ckpt.partial_removed", path=str(step_dir))
                shutil.rmtree(step_dir, ignore_errors=True)
            raise

    def _save_into(
        self,
        step_dir: Path,
        step: int,
        flat: dict[str, Any],
        trees: dict[str, Any],
        *,
        rank: int,
        world: int,
        started: float,
        trainer_state: dict[str, Any],
        transformer_config: Any,
        extra_files: dict[str, bytes] | None,
        manifest_extra: dict[str, Any] | None,
        writers: dict[str, Callable[[Path], None]] | None,
    ) -> Path:
        hashed: dict[str, mf.FileRecord] = {}  # files hashed while written
        for name, (skeleton, tensors) in flat.items():
            # Ranks may each hold entries the others lack (a model-parallel rank's own shards).
            merged = merge_skeletons(all_gather_objects(skeleton)) if world > 1 else skeleton
            hashed.update(self._save_component(step_dir / name, merged, tensors, write_structure=rank == 0))
        for name, write in (writers or {}).items():
            if rank == 0:
                (step_dir / name).mkdir()
            barrier()
            write(step_dir / name)
        (step_dir / "rng").mkdir(exist_ok=True)
        atomic_write_json(step_dir / "rng" / f"rank_{rank:05d}.json", capture_rng())
        if rank == 0:
            atomic_write_json(step_dir / "trainer_state.json", json_safe(trainer_state))
            if transformer_config is not None:
                atomic_write_json(step_dir / "transformer_config.json", json_safe(transformer_config))
            for name, data in (extra_files or {}).items():
                self._write_extra(step_dir, name, data)
        barrier()

        files = [f for f in mf.list_payload_files(step_dir) if f not in hashed]
        mine = files[rank::world]  # ranks split the hashing (and fsyncing)
        records: dict[str, mf.FileRecord] = dict(hashed)
        for part in all_gather_objects(mf.hash_files(step_dir, mine, threads=self.hash_threads)):
            records.update(part)
        if rank == 0:
            for directory in [p for p in step_dir.rglob("*") if p.is_dir()] + [step_dir, self.root]:
                fsync_dir(directory)
            components = sorted([*(k for k, v in trees.items() if v is not None), *(writers or {})])
            extra = {"world_size": world, "components": components}
            manifest = mf.build_manifest(step=step, files=records, extra={**extra, **(manifest_extra or {})})
            mf.write_manifest(step_dir, manifest)
            atomic_write_bytes(self.root / LATEST, f"{step_dir.name}\n".encode())
            seconds = time.perf_counter() - started
            log.info(
                "ckpt.saved",
                step=step,
                path=str(step_dir),
                bytes=manifest["total_bytes"],
                files=len(records),
                seconds=round(seconds, 3),
                gb_per_s=round(manifest["total_bytes"] / max(seconds, 1e-9) / 1e9, 3),
            )
            self._apply_retention(keep=step_dir)
        barrier()
        return step_dir

    def _space_problem(self, step: int) -> str | None:
        """Why a save of `step` must not start: less free space than the newest complete
        checkpoint takes on disk (its HF export included). None when it fits or nothing is known."""
        previous = self.latest_complete()
        if previous is None:
            return None
        needed = sum(f.stat().st_size for f in previous.rglob("*") if f.is_file())
        self.root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.root).free
        if free >= needed:
            return None
        gib = 2**30
        return (
            f"not enough disk space to save step {step} in {self.root}: {free / gib:.2f} GiB free, and the "
            f"last checkpoint ({previous.name}) takes {needed / gib:.2f} GiB. {previous} is complete and kept. "
            "Free space on that disk (with checkpoint.max_to_keep=N older checkpoints are deleted only after "
            "a new one is complete), then run the same command again to resume."
        )

    @staticmethod
    def record_hf_export(step_dir: str | Path, outcome: dict[str, Any]) -> None:
        """Add an HF export's outcome (`{"status": "ok" | "failed", ...}`) to a complete
        checkpoint's manifest as `hf_export`. The file list is unchanged: the training state stays
        verifiable and resumable whatever the export did. Call on one rank."""
        manifest = mf.read_manifest(Path(step_dir))
        manifest["hf_export"] = json_safe(outcome)
        mf.write_manifest(Path(step_dir), manifest)

    def _prepare_empty(self, step_dir: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if step_dir.exists():  # re-saving a step: un-complete it first, then clear it
            log.warning("ckpt.overwrite", path=str(step_dir))
            self._delete(step_dir)
        step_dir.mkdir()
        fsync_dir(self.root)

    def _save_component(
        self, directory: Path, skeleton: Any, tensors: dict[str, torch.Tensor], *, write_structure: bool
    ) -> dict[str, mf.FileRecord]:
        """Returns records (relative to the step dir) of files already hashed while written."""
        started = time.perf_counter()
        directory.mkdir(parents=True, exist_ok=True)
        hashed = tensor_store.save_tensors(directory, tensors) if tensors else {}
        if write_structure:
            atomic_write_json(directory / "structure.json", skeleton)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        log.debug(
            "ckpt.component_saved",
            component=directory.name,
            tensors=len(tensors),
            bytes=nbytes,
            seconds=round(time.perf_counter() - started, 3),
        )
        return {f"{directory.name}/{file}": record for file, record in hashed.items()}

    @staticmethod
    def _write_extra(step_dir: Path, name: str, data: bytes) -> None:
        target = step_dir / "extra" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, bytes(data))

    # ---- retention ---------------------------------------------------------------------------------
    def _apply_retention(self, *, keep: Path) -> None:
        if self.max_to_keep is None:
            return
        dirs = self.step_dirs()
        complete = [p for _, p in dirs if mf.check_complete(p) is None]
        kept = set(complete[: self.max_to_keep]) | {keep}
        keep_step = int(_STEP_RE.match(keep.name).group(1))  # type: ignore[union-attr]
        for step, path in dirs:
            stale_incomplete = path not in complete and step < keep_step  # leftovers of crashed saves
            if path not in kept and (path in complete or stale_incomplete):
                log.info(
                    "ckpt.delete", path=str(path), reason="retention" if path in complete else "incomplete"
                )
                self._delete(path)

    @staticmethod
    def _delete(path: Path) -> None:
        # Manifest first (and durably): a crash mid-delete leaves an incomplete dir, never a "complete" one
        # with files missing.
        (path / mf.MANIFEST_NAME).unlink(missing_ok=True)
        fsync_dir(path)
        shutil.rmtree(path)

    # ---- resume ------------------------------------------------------------------------------------
    def latest_complete(self) -> Path | None:
        """The checkpoint `latest` points to if complete; else the newest complete one (with warnings)."""
        pointed = self._read_latest_pointer()
        if pointed is not None:
            reason = mf.check_complete(pointed)
            if reason is None:
                return pointed
            log.warning("ckpt.latest_incomplete", path=str(pointed), reason=reason)
        for _, path in self.step_dirs():
            if path == pointed:
                continue
            reason = mf.check_complete(path)
            if reason is None:
                return path
            log.warning("ckpt.skip_incomplete", path=str(path), reason=reason)
        return None

    def _read_latest_pointer(self) -> Path | None:
        try:
            name = (self.root / LATEST).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return self.root / name if _STEP_RE.match(name) else None

    def resolve_resume(self, mode: str) -> Path | None:
        """`none` -> None; `auto` -> latest_complete() (None on a fresh run); else an explicit path, which
        must be a complete checkpoint (or a root holding some)."""
        if mode == "none":
            return None
        if mode == "auto":
            return self.latest_complete()
        path = Path(mode)
        if not path.is_dir():
            raise CheckpointNotFoundError(
                f"checkpoint.resume={mode!r}: no such directory; use 'auto', 'none' or a global_step_N path"
            )
        if not (path / mf.MANIFEST_NAME).exists() and not _STEP_RE.match(path.name):
            found = CheckpointManager(path).latest_complete()
            if found is None:
                raise CheckpointNotFoundError(f"checkpoint.resume={mode!r} holds no complete checkpoint")
            return found
        reason = mf.check_complete(path)
        if reason is not None:
            raise CheckpointNotFoundError(
                f"checkpoint.resume={mode!r} is not a complete checkpoint ({reason}); "
                "pick another global_step_N or use resume=auto"
            )
        return path

    # ---- load --------------------------------------------------------------------------------------
    def load(self, path: str | Path, *, verify: bool = True) -> LoadedCheckpoint:
        """Full (unsharded) tensors on CPU, whatever world size saved them. `verify` re-hashes every
        file first (ranks split the work) and raises CheckpointCorruptError on any mismatch."""
        path = Path(path)
        manifest = self.verify(path) if verify else mf.read_manifest(path)
        parts: dict[str, Any] = {}
        for name in COMPONENTS:
            structure = path / name / "structure.json"
            if not structure.is_file():
                parts[name] = None
                continue
            directory = path / name
            tensors = (
                tensor_store.load_full_tensors(directory) if tensor_store.has_tensor_files(directory) else {}
            )
            parts[name] = unflatten_state(read_json(structure), tensors)
        return LoadedCheckpoint(
            path=path,
            step=manifest["step"],
            model=parts["model"],
            optimizer=parts["optimizer"],
            scheduler=parts["scheduler"],
            trainer_state=read_json(path / "trainer_state.json"),
            dataloader_state=parts["dataloader"],
            rng=self._load_rng(path),
            manifest=manifest,
        )

    def load_into(self, path: str | Path, *, component: str, target: Any) -> None:
        """Fill the tensors of `target` (same structure as saved; DTensor shards or full tensors) in
        place. Collective when distributed: for resuming sharded state at any world size."""
        if component not in COMPONENTS:
            raise ValueError(f"component {component!r} is not one of {COMPONENTS}")
        _, tensors = flatten_state(target)
        saved_keys = set(tensor_keys(read_json(Path(path) / component / "structure.json")))
        if set(tensors) != saved_keys:
            raise ValueError(
                f"{component} target does not match the checkpoint: missing {sorted(saved_keys - set(tensors))[:10]}"
                f", unexpected {sorted(set(tensors) - saved_keys)[:10]}"
            )
        tensor_store.load_tensors_into(Path(path) / component, tensors)

    def verify(self, path: str | Path) -> dict[str, Any]:
        """Re-hash the checkpoint's files against its manifest; CheckpointCorruptError when any differ."""
        path = Path(path)
        rank, world = rank_and_world()
        files = sorted(mf.read_manifest(path)["files"])
        errors = all_gather_objects(_verify_or_message(path, files[rank::world], self.hash_threads))
        problems = [e for e in errors if e]
        if problems:
            raise CheckpointCorruptError("\n".join(problems))
        return mf.read_manifest(path)

    @staticmethod
    def _load_rng(path: Path) -> dict[str, Any] | None:
        rank, _ = rank_and_world()
        own = path / "rng" / f"rank_{rank:05d}.json"
        if own.is_file():
            return read_json(own)
        log.warning(
            "ckpt.rng_missing", path=str(own), reason="saved at a different world size; RNG not restored"
        )
        return None


def _check_extra_name(name: str) -> None:
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or any(p.startswith(".") for p in rel.parts):
        raise ValueError(
            f"extra file name {name!r} must be a relative path inside the checkpoint (no '..', no dot files)"
        )


def _verify_or_message(path: Path, files: list[str], threads: int) -> str | None:
    try:
        mf.verify(path, threads=threads, only=files)
    except CheckpointCorruptError as exc:
        return str(exc)
    return None
