"""Per-step metrics to the console (structlog), a JSONL file, TensorBoard and Weights & Biases;
validation samples; the end-of-run plot."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger()

# Shown on the console line (everything goes to JSONL / TensorBoard).
CONSOLE_KEYS = (
    "reward/mean",
    "response_length/mean",
    "actor/kl",
    "actor/entropy",
    "actor/pg_loss",
    "actor/grad_norm",
    "val/reward_mean",
    "timing/step_s",
)
PLOT_PANELS = (
    ("reward/mean", "reward (mean)"),
    ("actor/kl", "KL(policy || ref)"),
    ("response_length/mean", "response length (tokens)"),
)


VAL_GENERATIONS_FILE = "val_generations.jsonl"


@dataclass(frozen=True)
class WandbRun:
    """What a Weights & Biases run is started with (verl's: project, experiment name, the config)."""

    project: str
    name: str
    config: dict[str, Any]


def pick_val_generations(
    inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float], count: int
) -> list[tuple[str, str, float]]:
    """`count` validation samples picked as verl's `log_val_generations` picks them: sorted by
    prompt text, shuffled with a fixed seed (numpy's RandomState(42)), the first `count`."""
    samples = sorted(zip(inputs, outputs, scores, strict=True), key=lambda sample: sample[0])
    np.random.RandomState(42).shuffle(samples)
    return samples[:count]


class MetricsLogger:
    """Appends one JSON object per step to `<dir>/metrics.jsonl` (resumed runs keep appending and
    readers keep the last record of a step), mirrors scalars to TensorBoard (`tensorboard_dir`,
    default `<dir>/tensorboard`) and, given `wandb`, to a Weights & Biases run (a new one each
    launch, as verl's; files under `<dir>/wandb`)."""

    def __init__(
        self,
        directory: Path,
        *,
        console: bool,
        jsonl: bool,
        tensorboard: bool,
        tensorboard_dir: Path | None = None,
        wandb: WandbRun | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.console = console
        self.jsonl_path = directory / "metrics.jsonl" if jsonl else None
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8") if self.jsonl_path else None
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(tensorboard_dir or directory / "tensorboard"))
        self._wandb = None
        self._wandb_table: list[list[Any]] = []
        if wandb is not None:
            import wandb as wandb_module

            self._wandb = wandb_module.init(
                project=wandb.project, name=wandb.name, config=wandb.config, dir=str(directory)
            )
            log.info("metrics.wandb", project=wandb.project, name=wandb.name, url=self._wandb.url)

    def log(self, step: int, metrics: dict[str, float], *, console: bool = True) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self.console and console:
            shown = {k.replace("/", "_"): round(clean[k], 4) for k in CONSOLE_KEYS if k in clean}
            log.info("train.step", step=step, **shown)

    def log_generations(self, step: int, samples: Sequence[tuple[str, str, float]]) -> None:
        """Validation samples (prompt, response, score): a line of `val_generations.jsonl`, a
        TensorBoard text and a row of the wandb table `val/generations` (verl's layout: step, then
        input / output / score of each sample)."""
        if not samples:
            return
        rows = [{"input": i, "output": o, "score": float(s)} for i, o, s in samples]
        with (self.directory / VAL_GENERATIONS_FILE).open("a", encoding="utf-8") as out:
            out.write(json.dumps({"step": step, "samples": rows}) + "\n")
        if self._tb is not None:
            text = "\n\n".join(
                f"### Sample {k}\n\n**Input:** {r['input']}\n\n**Output:** {r['output']}\n\n**Score:** {r['score']}"
                for k, r in enumerate(rows, 1)
            )
            self._tb.add_text("val/generations", text, step)
        if self._wandb is not None:
            import wandb as wandb_module

            columns = ["step"] + [f"{part}_{k}" for k in range(1, len(rows) + 1) for part in ("input", "output", "score")]
            if self._wandb_table and len(self._wandb_table[0]) != len(columns):
                self._wandb_table = []  # a later validation with fewer samples starts the table again
            self._wandb_table.append([step, *(v for r in rows for v in (r["input"], r["output"], r["score"]))])
            self._wandb.log({"val/generations": wandb_module.Table(columns=columns, data=self._wandb_table)}, step=step)

    def rewind(self, step: int) -> int:
        """Keep the records up to `step` (a resumed run's checkpoint) in metrics.jsonl (and
        val_generations.jsonl), moving those of later, abandoned steps to metrics.abandoned.jsonl
        (val_generations.abandoned.jsonl); returns how many metrics records moved. TensorBoard's
        event files cannot be cut: it shows the resumed steps as a second line over the first."""
        _cut_after(self.directory / VAL_GENERATIONS_FILE, step)
        if self.jsonl_path is None:
            return 0
        if self._jsonl is not None:
            self._jsonl.close()
        moved = _cut_after(self.jsonl_path, step)
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        return moved

    def logged_steps(self) -> set[int]:
        """Steps with a record in the JSONL file (empty without one)."""
        return set(read_metrics(self.jsonl_path)) if self.jsonl_path is not None else set()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _cut_after(path: Path, step: int) -> int:
    """Move the records of `path` (JSON lines with a "step") past `step` to `<stem>.abandoned.jsonl`
    beside it; the file is replaced whole, never left half-written. Returns how many moved."""
    if not path.exists():
        return 0
    kept, moved = [], []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            later = int(json.loads(line)["step"]) > step
        except (ValueError, KeyError, TypeError):  # a record cut short by a kill: not worth keeping
            later = True
        (moved if later else kept).append(line if line.endswith("\n") else line + "\n")
    if not moved:
        return 0
    with path.with_name(path.stem + ".abandoned.jsonl").open("a", encoding="utf-8") as side:
        side.writelines(moved)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(path)
    return len(moved)


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """step -> metrics from a JSONL file (the last record of a step wins)."""
    records: dict[int, dict[str, float]] = {}
    if not path.exists():
        return records
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row: dict[str, Any] = json.loads(line)
            step = int(row.pop("step"))
        except (ValueError, KeyError, TypeError) as exc:  # a record cut short by a kill mid-write
            log.warning("metrics.unreadable_record", path=str(path), line=number, error=repr(exc))
            continue
        records[step] = row
    return dict(sorted(records.items()))


def plot_metrics(jsonl_path: Path, png_path: Path) -> Path:
    """A PNG with one panel per PLOT_PANELS metric against the training step."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    records = read_metrics(jsonl_path)
    fig, axes = plt.subplots(len(PLOT_PANELS), 1, figsize=(7, 2.6 * len(PLOT_PANELS)), sharex=True)
    for ax, (key, title) in zip(axes, PLOT_PANELS, strict=True):
        points = [(step, row[key]) for step, row in records.items() if key in row]
        if points:
            ax.plot(*zip(*points, strict=True), marker=".", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("training step")
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
