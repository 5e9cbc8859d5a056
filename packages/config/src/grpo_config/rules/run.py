"""The run's own settings: names, steps, `checkpoint`, `logging`, `timeouts`."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re

from grpo_config.rules.common import Range, range_problems
from grpo_config.schema import TimeoutsConfig, TrainerConfig

TIMEOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TimeoutsConfig)}

FOLDER_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")

RANGES: tuple[Range, ...] = (
    ("logging.val_generations", lambda v: v >= 0, ">= 0 samples (0: none)"),
    ("checkpoint.save_freq", lambda v: v == -1 or v >= 1, "-1 (only at the end) or >= 1 steps"),
    ("checkpoint.max_to_keep", lambda v: v is None or v >= 1, ">= 1 or null (keep all)"),
    ("test_freq", lambda v: v == -1 or v >= 1, "-1 (never) or >= 1 steps"),
    ("total_epochs", lambda v: v >= 1, ">= 1"),
    ("total_training_steps", lambda v: v is None or v >= 1, ">= 1 or null (total_epochs decides)"),
    (
        "timeouts.collective_s",
        lambda v: v is None or 0 < v < math.inf,
        "a positive, finite number of seconds or null",
    ),
)


def run_problems(cfg: TrainerConfig) -> list[str]:
    problems = range_problems(cfg, RANGES)
    problems += [
        f"{key}={name!r} names a folder (<logging.dir>/<project_name>/<experiment_name>): use letters, "
        f"digits, '.', '_' or '-', not starting with '.'."
        for key, name in (("project_name", cfg.project_name), ("experiment_name", cfg.experiment_name))
        if not FOLDER_NAME.fullmatch(name)
    ]
    if cfg.max_zero_advantage_steps < 0:
        problems.append(
            f"max_zero_advantage_steps={cfg.max_zero_advantage_steps} must be >= 0 (0: never stop for "
            "steps whose advantages are all zero)."
        )
    if cfg.logging.wandb and importlib.util.find_spec("wandb") is None:
        problems.append(
            "logging.wandb=true (trainer.logger 'wandb') needs the wandb package, which is not installed here: "
            "`pip install wandb` (or `pip install grpo-trainer[wandb]`), or drop 'wandb' from trainer.logger."
        )
    for name, default in TIMEOUT_DEFAULTS.items():
        seconds = getattr(cfg.timeouts, name)
        if default is not None and not 0.0 < seconds < math.inf:
            problems.append(
                f"timeouts.{name}={seconds} must be a positive, finite number of seconds (how long the "
                f"driver waits for every rank in that phase before it stops the run): set "
                f"timeouts.{name} to e.g. {default:g}."
            )
    return problems
