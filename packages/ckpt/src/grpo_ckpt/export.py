"""HF export: Megatron-Bridge `save_hf_weights` with a strictness we can explain, and a torch path.

Megatron-Bridge's own strict=True catches source tensors that were not written, but a tensor the
model exports whose name the *source* checkpoint lacks is dropped silently (its conversion task is
skipped with a log line). So besides calling the bridge we compare what was written with the keys
the model itself maps to (the bridge's config-only conversion tasks, unfiltered) and report, or under
strict raise, the difference. A finished export gets `grpo_export_manifest.json` (written last) with
file sizes, sha256 and every skipped key.
"""

from __future__ import annotations

import fnmatch
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
from safetensors import safe_open

from grpo_ckpt import manifest as mf
from grpo_ckpt.atomic_io import atomic_write_json
from grpo_ckpt.dist_utils import all_gather_objects, barrier, rank_and_world
from grpo_ckpt.errors import StrictExportError
from grpo_ckpt.vision_language import restore_vision_language_layout

log = structlog.get_logger()

__all__ = ["EXPORT_MANIFEST", "ExportReport", "export_hf", "export_hf_torch", "written_keys"]

EXPORT_MANIFEST = "grpo_export_manifest.json"
_SHOWN = 20


@dataclass(frozen=True, kw_only=True)
class ExportReport:
    path: Path
    strict: bool
    backend: str
    written: list[str]
    model_keys_not_written: list[str] = field(default_factory=list)  # the model has them; the files lack them
    source_keys_not_written: list[str] = field(default_factory=list)  # the source checkpoint has them
    # Tensors copied unchanged from the source checkpoint (a vision tower the model did not hold).
    copied_from_source: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.model_keys_not_written and not self.source_keys_not_written

    def to_manifest(self) -> dict[str, Any]:
        """What a checkpoint manifest records about this export (`manifest_extra={"hf_export": ...}`)."""
        data = asdict(self)
        data["path"] = str(self.path)
        data["written"] = len(self.written)
        data["copied_from_source"] = len(self.copied_from_source)
        return data


def written_keys(path: str | Path) -> list[str]:
    """Tensor names in every safetensors file under `path` (headers only)."""
    keys: list[str] = []
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            keys.extend(handle.keys())
    return sorted(keys)


def _model_hf_keys(bridge: Any, model: list[Any]) -> set[str]:
    """HF names this rank's part of `model` maps to, not filtered by the source checkpoint's keys.

    Uses the bridge's config-only planning (`build_conversion_tasks` with a PretrainedConfig), the path
    its own config-only export takes. It stores its argument on the model bridge, so we put it back.
    """
    model_bridge = bridge._model_bridge
    saved = {name: getattr(model_bridge, name) for name in ("hf_pretrained", "hf_config") if hasattr(model_bridge, name)}
    try:
        tasks = model_bridge.build_conversion_tasks(bridge.hf_pretrained.config, model)
    finally:
        for name, value in saved.items():
            setattr(model_bridge, name, value)
    keys: set[str] = set()
    for task in tasks:
        if task is None:
            continue
        hf_param = task.mapping.hf_param
        keys.update([hf_param] if isinstance(hf_param, str) else hf_param.values())
    return keys


def _source_keys(bridge: Any) -> set[str]:
    state = getattr(bridge.hf_pretrained, "state", None)
    source = getattr(state, "source", None)
    return set(source.get_all_keys()) if source is not None else set()


def _minus(keys: set[str], others: set[str]) -> list[str]:
    """`keys` not in `others`, where `others` may hold wildcard patterns."""
    patterns = [o for o in others if "*" in o]
    return sorted(k for k in keys if k not in others and not any(fnmatch.fnmatchcase(k, p) for p in patterns))


def _listing(label: str, keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN]) + (f", ... (+{len(keys) - _SHOWN})" if len(keys) > _SHOWN else "")
    return f"{label} ({len(keys)}): {shown or '-'}"


def _strict_error(reason: str, *, missing: list[str], unexpected: list[str]) -> StrictExportError:
    return StrictExportError(
        f"strict HF export failed: {reason}\n  "
        + _listing("missing (should be in the export, are not)", missing)
        + "\n  "
        + _listing("unexpected (the model has them, the source checkpoint does not)", unexpected)
        + "\nFix the model/checkpoint mapping, or set checkpoint.strict=false to export what can be "
        "exported; the export manifest then records every skipped key.",
        missing=missing,
        unexpected=unexpected,
    )


def export_hf(
    bridge: Any,
    model: Any,
    path: str | Path,
    *,
    strict: bool,
    show_progress: bool = False,
    vision_language_source: str | Path | None = None,
) -> ExportReport:
    """Megatron -> HF safetensors via `bridge.save_hf_weights(model, path, strict=strict)`.

    Collective (every rank calls it). strict=True: any key the bridge refuses, or any model tensor
    missing from the written files, raises StrictExportError listing missing and unexpected keys.
    strict=False: the report and `grpo_export_manifest.json` list what was skipped. With
    `vision_language_source` (the model was read from that vision-language checkpoint through a
    text-only bridge), the checked export is then put into the source's layout
    (`vision_language.restore_vision_language_layout`); a source vision tensor the model did not
    export is copied and listed as copied in the report.
    """
    path = Path(path)
    model = model if isinstance(model, list) else [model]
    rank, _ = rank_and_world()
    started = time.perf_counter()
    expected: set[str] = set().union(*all_gather_objects(_model_hf_keys(bridge, model)))
    source = _source_keys(bridge)
    try:
        bridge.save_hf_weights(model, path, strict=strict, show_progress=show_progress)
    except (KeyError, RuntimeError) as exc:
        if not strict:
            raise
        unexpected = _minus(expected, source)
        raise _strict_error(
            f"Megatron-Bridge refused ({type(exc).__name__}: {exc})",
            missing=_minus(source, expected),
            unexpected=unexpected,
        ) from exc

    report = None
    if rank == 0:
        written = written_keys(path)
        report = ExportReport(
            path=path,
            strict=strict,
            backend="megatron-bridge",
            written=written,
            model_keys_not_written=_minus(expected, set(written)),
            source_keys_not_written=_minus(source, set(written)),
            seconds=round(time.perf_counter() - started, 3),
        )
    report = all_gather_objects(report)[0]
    if strict and report.model_keys_not_written:
        raise _strict_error(
            "the bridge dropped model tensors whose names the source checkpoint lacks (it does so silently "
            "even with strict=True)",
            missing=report.model_keys_not_written,
            unexpected=_minus(expected, source),
        )
    if rank == 0:
        _write_model_config(bridge, path)
        if vision_language_source is not None:
            copied = restore_vision_language_layout(path, source=vision_language_source)
            report = replace(report, written=written_keys(path), copied_from_source=copied)
        _finish(report)
    if vision_language_source is None:
        barrier()
        return report
    return all_gather_objects(report)[0]  # rank 0's report of the restored layout (and the barrier)


_CONFIG_FILES = ("config.json", "generation_config.json")


def _write_model_config(bridge: Any, path: Path) -> None:
    """`save_hf_weights` writes tensors only: without the source checkpoint's config.json (and
    generation config) transformers and vLLM cannot load the export (found loading a text-only
    Megatron export into vLLM; the vision-language layout copies its source's config itself)."""
    hf = bridge.hf_pretrained
    source = getattr(hf, "model_name_or_path", None)
    source = Path(source) if source is not None else None
    for name in _CONFIG_FILES:
        if not (path / name).exists() and source is not None and (source / name).is_file():
            shutil.copy(source / name, path / name)
    if not (path / "config.json").exists():
        hf.config.save_pretrained(path)


def export_hf_torch(model: Any, tokenizer: Any, path: str | Path, *, strict: bool = True) -> ExportReport:
    """HF-model backend: `model.save_pretrained` (safetensors) + `tokenizer.save_pretrained` when given.

    transformers writes its checkpoint format, not the module's names (fused MoE experts are written
    per expert; tied weights once), so the export is checked the way a user reads it: loaded back
    with transformers. A model tensor the load does not find (or finds with another shape) raises
    `StrictExportError` under `strict` (the files stay, with no export manifest); without `strict`
    the manifest lists it.
    """
    path = Path(path)
    started = time.perf_counter()
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    written = set(written_keys(path))
    report = ExportReport(
        path=path,
        strict=strict,
        backend="torch",
        written=sorted(written),
        model_keys_not_written=_not_loaded_back(type(model), path),
        seconds=round(time.perf_counter() - started, 3),
    )
    if strict and report.model_keys_not_written:
        raise _strict_error(
            "transformers' save_pretrained wrote no file holding these model tensors",
            missing=report.model_keys_not_written,
            unexpected=[],
        )
    _finish(report)
    return report


def _not_loaded_back(model_class: Any, path: Path) -> list[str]:
    """Model tensors that loading `path` back with transformers does not find, or finds with
    another shape."""
    _, info = model_class.from_pretrained(path, output_loading_info=True)
    mismatched = [entry[0] if isinstance(entry, tuple) else entry for entry in info.get("mismatched_keys", [])]
    return sorted({*info["missing_keys"], *mismatched})


def _finish(report: ExportReport) -> None:
    if not report.complete:
        log.warning(
            "ckpt.hf_export_skipped",
            path=str(report.path),
            model_keys_not_written=report.model_keys_not_written[:_SHOWN],
            source_keys_not_written=report.source_keys_not_written[:_SHOWN],
        )
    files = mf.hash_files(report.path, [p for p in mf.list_payload_files(report.path) if p != EXPORT_MANIFEST])
    manifest = mf.build_manifest(step=-1, files=files, extra={"hf_export": report.to_manifest()})
    manifest["format"] = "grpo-hf-export"
    atomic_write_json(report.path / EXPORT_MANIFEST, manifest)
    log.info("ckpt.hf_exported", path=str(report.path), backend=report.backend, tensors=len(report.written),
             bytes=manifest["total_bytes"], seconds=report.seconds)
