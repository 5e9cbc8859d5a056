"""`prepare-data`: build verl-format parquet (`train.parquet`, `test.parquet`) for geo3k, gsm8k or
gsm8k_tool (gsm8k whose system turn asks for the calculator tool: docs/MULTI_TURN.md).

Sources, in the order they are tried:
- a `datasets.save_to_disk` directory (a DatasetDict with train/test or validation splits);
- a directory of parquet/json/jsonl files, e.g. a downloaded hub snapshot (split names from file
  names; for gsm8k a `main/` sub-directory is used when present);
- a hub id (default: the dataset's own), when the hub is reachable.

Usage: `hatch run prepare-data --dataset geo3k --out ~/data/geo3k [--source DIR_OR_HUB_ID]`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from grpo_launch.dataset_rows import RECIPES, DatasetRecipe
from grpo_launch.errors import LaunchError

log = structlog.get_logger()

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_CHUNK_ROWS = 512


def default_output_dir(dataset: str, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("DATA_DIR") or Path.home() / "data").expanduser() / dataset


def prepare_dataset(dataset: str, *, output_dir: Path, source: str | None = None) -> dict[str, Path]:
    """Write `<output_dir>/<split>.parquet` for each split of the recipe; returns split -> path.
    Rows the recipe cannot convert are skipped and counted in a warning."""
    if dataset not in RECIPES:
        raise LaunchError(f"unknown dataset {dataset!r}; choose one of {', '.join(sorted(RECIPES))}")
    recipe = RECIPES[dataset]
    source = source or recipe.hub_id
    with tempfile.TemporaryDirectory(prefix="grpo-prepare-") as cache_dir:
        splits = _load_source(source, recipe=recipe, cache_dir=cache_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        written = {}
        for out_split, candidates in recipe.splits.items():
            name = next((c for c in candidates if c in splits), None)
            if name is None:
                raise LaunchError(
                    f"{source} has splits {sorted(splits)}; {dataset} needs one of {list(candidates)} "
                    f"for its {out_split!r} split"
                )
            written[out_split] = _write_split(
                splits[name], recipe=recipe, split=out_split, output_dir=output_dir
            )
    return written


def _load_source(source: str, *, recipe: DatasetRecipe, cache_dir: str) -> Any:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the launcher packages depend on datasets
        raise LaunchError("prepare-data needs the `datasets` package: pip install 'datasets>=5'") from exc
    path = Path(source).expanduser()
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_dir():
            if recipe.hub_config and (path / recipe.hub_config).is_dir():
                path = path / recipe.hub_config
            loaded = datasets.load_dataset(str(path), cache_dir=cache_dir)
        elif _HUB_ID.match(source) and not path.exists():
            loaded = datasets.load_dataset(source, recipe.hub_config)
        else:
            raise LaunchError(
                f"data source {source!r} is neither a directory nor a hub id like {recipe.hub_id!r}"
            )
    except LaunchError:
        raise
    except Exception as exc:  # datasets raises many types (network, format); all mean "cannot read it"
        raise LaunchError(
            f"could not read {recipe.name} from {source!r}: {type(exc).__name__}: {exc}. Without hub "
            f"access, copy the dataset to this machine (e.g. `hf download {recipe.hub_id} --repo-type "
            "dataset --local-dir DIR`, or `save_to_disk`) and pass --source DIR."
        ) from exc
    if isinstance(loaded, datasets.Dataset):
        raise LaunchError(
            f"{source} holds a single split; {recipe.name} needs a DatasetDict with "
            f"{', '.join(recipe.splits)} splits (save it with DatasetDict(...).save_to_disk)"
        )
    return loaded


def _write_split(ds: Any, *, recipe: DatasetRecipe, split: str, output_dir: Path) -> Path:
    missing = [c for c in recipe.required_columns if c not in ds.column_names]
    if missing:
        raise LaunchError(f"{recipe.name} {split} split lacks columns {missing}; it has {ds.column_names}")
    # Arrow format keeps images as their stored {"bytes", "path"} structs, which is what verl-format
    # parquet holds, instead of decoding them to PIL objects.
    raw = ds.with_format("arrow")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for start in range(0, len(ds), _CHUNK_ROWS):
        for offset, example in enumerate(raw[start : start + _CHUNK_ROWS].to_pylist()):
            try:
                rows.append(recipe.to_row(example, start + offset, split))
            except (ValueError, KeyError, TypeError) as exc:
                skipped.append(f"row {start + offset}: {exc}")
    if not rows:
        raise LaunchError(f"{recipe.name} {split}: no convertible rows ({'; '.join(skipped[:3])})")
    if skipped:
        log.warning("rows skipped", dataset=recipe.name, split=split, count=len(skipped), first=skipped[:3])
    target = output_dir / f"{split}.parquet"
    partial = target.with_suffix(".parquet.partial")
    pq.write_table(pa.Table.from_pylist(rows), partial)
    partial.replace(target)  # never leave a half-written file under the final name
    log.info("wrote verl-format parquet", dataset=recipe.name, split=split, rows=len(rows), path=str(target))
    return target


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prepare-data", description="Build verl-format train/test parquet for geo3k, gsm8k or gsm8k_tool."
    )
    parser.add_argument("--dataset", required=True, choices=sorted(RECIPES))
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: $DATA_DIR/<dataset> or ~/data/<dataset>)",
    )
    parser.add_argument(
        "--source",
        default=None,
        help="a save_to_disk directory, a directory of parquet/json files, or a hub id (default: the dataset's hub id)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from grpo_launch.logging_setup import configure_logging

    args = build_parser().parse_args(_drop_separator(argv))
    configure_logging(level=args.log_level)
    out = (args.out or default_output_dir(args.dataset)).expanduser()
    try:
        written = prepare_dataset(args.dataset, output_dir=out, source=args.source)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, path in written.items():
        print(f"{split}: {path}")
    return 0


def _drop_separator(argv: Sequence[str] | None) -> list[str]:
    """`hatch run prepare-data -- --dataset x` may pass the `--` through; options follow it here."""
    args = list(sys.argv[1:] if argv is None else argv)
    return args[1:] if args[:1] == ["--"] else args


if __name__ == "__main__":
    raise SystemExit(main())
