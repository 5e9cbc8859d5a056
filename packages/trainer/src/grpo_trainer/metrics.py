"""Per-step metrics to the console (structlog), a JSONL file and TensorBoard; the end-of-run plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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


class MetricsLogger:
    """Appends one JSON object per step to `<dir>/metrics.jsonl` (resumed runs keep appending and
    readers keep the last record of a step) and mirrors scalars to TensorBoard (`tensorboard_dir`,
    default `<dir>/tensorboard`)."""

    def __init__(
        self, directory: Path, *, console: bool, jsonl: bool, tensorboard: bool, tensorboard_dir: Path | None = None
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

    def log(self, step: int, metrics: dict[str, float], *, console: bool = True) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
        if self.console and console:
            shown = {k.replace("/", "_"): round(clean[k], 4) for k in CONSOLE_KEYS if k in clean}
            log.info("train.step", step=step, **shown)

    def rewind(self, step: int) -> int:
        """Keep the records up to `step` (a resumed run's checkpoint) in metrics.jsonl, moving those
        of later, abandoned steps to metrics.abandoned.jsonl; returns how many moved. TensorBoard's
        event files cannot be cut: it shows the resumed steps as a second line over the first."""
        if self.jsonl_path is None or not self.jsonl_path.exists():
            return 0
        kept, moved = [], []
        for line in self.jsonl_path.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                later = int(json.loads(line)["step"]) > step
            except (ValueError, KeyError, TypeError):  # a record cut short by a kill: not worth keeping
                later = True
            (moved if later else kept).append(line if line.endswith("\n") else line + "\n")
        if not moved:
            return 0
        if self._jsonl is not None:
            self._jsonl.close()
        with (self.directory / "metrics.abandoned.jsonl").open("a", encoding="utf-8") as side:
            side.writelines(moved)
        tmp = self.jsonl_path.with_name(self.jsonl_path.name + ".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(self.jsonl_path)
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        return len(moved)

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
