"""Reading verl-format rows from parquet and JSON-lines files, and checking their shape.

A row is a mapping with a chat `prompt` (a list of `{"role", "content"}` messages, or a plain
string), a `data_source` string, `reward_model.ground_truth` and an optional `extra_info` mapping.
Rows are numbered in file order across all files (0-based); a line that is not valid JSON keeps
its number so that indices match positions in the files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger()

MAX_REPORTED_REASONS = 5
SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


class DataFileError(ValueError):
    """A data file that cannot be read at all (missing, unknown format, unreadable parquet)."""


@dataclass(kw_only=True)
class DataReport:
    """What happened to the rows of a dataset. `reasons` keeps the first few malformed rows."""

    n_rows: int = 0
    n_kept: int = 0
    n_malformed: int = 0
    n_filtered_overlong: int = 0
    n_truncated: int = 0
    reasons: list[str] = field(default_factory=list)

    def add_malformed(self, *, index: int, location: str, reason: str) -> None:
        self.n_malformed += 1
        if len(self.reasons) < MAX_REPORTED_REASONS:
            self.reasons.append(f"row {index} ({location}): {reason}")

    def summary(self) -> str:
        text = (
            f"{self.n_rows} rows read, {self.n_kept} kept, {self.n_malformed} malformed, "
            f"{self.n_filtered_overlong} overlong filtered, {self.n_truncated} truncated"
        )
        if self.reasons:
            text += "; first malformed: " + "; ".join(self.reasons)
        return text


@dataclass(frozen=True, kw_only=True)
class RawRow:
    """One row as read: `row` is None when the line could not be parsed (`error` says why)."""

    index: int
    location: str
    row: Any = None
    error: str | None = None
    path: Path | None = None  # the file it came from (relative image paths start at its folder)


def as_path_list(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    if not items:
        raise DataFileError("no data files given; set data.train_files (parquet or jsonl paths)")
    return [Path(p) for p in items]


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise DataFileError(
            f"data file {str(path)!r} does not exist (or is not a file): give data.train_files / data.val_files "
            "(TRAIN_FILES / VAL_FILES for the launchers) existing parquet or jsonl files, or build them with "
            "`hatch run prepare-data`"
        )
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise DataFileError(
            f"data file {str(path)!r}: unsupported suffix {path.suffix!r}; use one of {SUPPORTED_SUFFIXES}"
        )


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any, str | None]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise DataFileError(f"cannot read parquet file {str(path)!r}: {exc}") from exc
    for i, row in enumerate(table.to_pylist()):
        yield f"{path.name}#{i}", row, None


def _json_rows(path: Path) -> Iterator[tuple[str, Any, str | None]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{str(path)!r} is not a valid JSON array: {exc}") from exc
        for i, row in enumerate(rows):
            yield f"{path.name}[{i}]", row, None
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path.name}:{lineno}", json.loads(line), None
        except json.JSONDecodeError as exc:
            yield f"{path.name}:{lineno}", None, f"invalid JSON ({exc.msg})"


def read_raw_rows(paths: str | Path | Sequence[str | Path]) -> Iterator[RawRow]:
    """Every row of every file, in order, parse failures included (as rows with an error)."""
    files = as_path_list(paths)
    for path in files:
        _check_file(path)
    index = 0
    for path in files:
        reader = _parquet_rows if path.suffix == ".parquet" else _json_rows
        for location, row, error in reader(path):
            yield RawRow(index=index, location=location, row=row, error=error, path=path)
            index += 1


def load_rows(
    paths: str | Path | Sequence[str | Path], *, report: DataReport | None = None
) -> list[dict[str, Any]]:
    """All parseable rows of the given parquet / jsonl / json files as dicts, in order. Lines
    that are not JSON objects are skipped and recorded in `report` (or logged when none is given)."""
    own_report = report if report is not None else DataReport()
    rows: list[dict[str, Any]] = []
    for raw in read_raw_rows(paths):
        own_report.n_rows += 1
        if raw.error is not None or not isinstance(raw.row, Mapping):
            reason = raw.error or f"row is a {type(raw.row).__name__}, not an object"
            own_report.add_malformed(index=raw.index, location=raw.location, reason=reason)
            continue
        rows.append(dict(raw.row))
    own_report.n_kept = len(rows)
    if report is None and own_report.n_malformed:
        log.warning("data rows skipped", count=own_report.n_malformed, examples=own_report.reasons)
    return rows


def _check_messages(prompt: Any, prompt_key: str) -> str | None:
    if isinstance(prompt, str):
        return None if prompt.strip() else f"{prompt_key!r} is an empty string"
    if not isinstance(prompt, list) or not prompt:
        return f"{prompt_key!r} must be a non-empty list of {{role, content}} messages, got {type(prompt).__name__}"
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            return f"{prompt_key}[{i}] is a {type(message).__name__}, not a message object"
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            return f"{prompt_key}[{i}] needs string 'role' and 'content'"
    return None


def row_problem(row: Mapping[str, Any], *, prompt_key: str) -> str | None:
    """Why `row` cannot be used as a prompt row, or None when it can."""
    if prompt_key not in row:
        return f"missing {prompt_key!r}"
    problem = _check_messages(row[prompt_key], prompt_key)
    if problem:
        return problem
    source = row.get("data_source")
    if not isinstance(source, str) or not source:
        return "missing or non-string 'data_source'"
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        return "missing 'reward_model.ground_truth'"
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, Mapping):
        return f"'extra_info' must be an object, got {type(extra).__name__}"
    return None
