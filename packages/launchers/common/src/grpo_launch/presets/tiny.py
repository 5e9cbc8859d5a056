"""The `tiny` preset: a CPU run of a few minutes in which the reward visibly rises.

Model: `Qwen3_5MoeForCausalLM` shrunk to ~1.2 M random weights (see `tiny_model`); measured on 2
CPU cores it trains at a tolerable speed once the experts run as a loop ("eager"), so the Qwen3-MoE
fallback was not needed. Task: "repeat the digit" (see `tiny_task`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_tiny import model as tiny_model
from grpo_tiny import task as tiny_task

TRAIN_ROWS = 256
VAL_ROWS = 32


def tiny_preset(workdir: Path) -> dict[str, Any]:
    """Build (if missing) the tiny model, tokenizer and parquet data under `workdir` and return
    the nested config dict for `grpo_config.load`. Everything the run writes goes under `workdir`."""
    workdir = Path(workdir).resolve()
    model_dir = tiny_model.ensure_tiny_model(workdir / "model", texts=tiny_task.corpus())
    train_file, val_file = ensure_data(workdir / "data", tiny_task.make_rows)
    return tiny_config(workdir, model_dir=model_dir, train_file=train_file, val_file=val_file)


def ensure_data(data_dir: Path, make_rows: Callable[..., list[dict[str, Any]]]) -> tuple[Path, Path]:
    """`train.parquet` (TRAIN_ROWS rows) and `val.parquet` (VAL_ROWS) under `data_dir`, written by
    `make_rows(count=, seed=, split=)` unless already there."""
    train_file, val_file = data_dir / "train.parquet", data_dir / "val.parquet"
    for path, count, seed, split in ((train_file, TRAIN_ROWS, 0, "train"), (val_file, VAL_ROWS, 1, "val")):
        if not path.exists():
            tiny_task.write_parquet(make_rows(count=count, seed=seed, split=split), path)
    return train_file, val_file


def tiny_config(workdir: Path, *, model_dir: Path, train_file: Path, val_file: Path) -> dict[str, Any]:
    """The tiny run's settings over a built model and data (the `tiny-vl` preset shares them)."""
    return {
        "project_name": "grpo",
        "experiment_name": "tiny",
        "seed": 1,
        "total_training_steps": 50,
        "test_freq": 10,
        "device": {"kind": "cpu", "nnodes": 1, "devices_per_node": 2},
        "data": {
            "train_files": [str(train_file)],
            "val_files": [str(val_file)],
            "max_prompt_length": 8,
            "max_response_length": 8,
            "train_batch_size": 16,
            "seed": 1,
        },
        "actor": {
            "model_path": str(model_dir),
            "backend": "torch",
            "dtype": "float32",
            "lr": 1e-3,
            "weight_decay": 0.0,
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_device": 32,
            "log_prob_micro_batch_size_per_device": 64,
            "use_kl_loss": True,
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
        },
        "rollout": {"engine": "hf", "n": 8, "temperature": 1.0, "val_n": 1, "val_temperature": 0.0},
        # The task's reward travels with the config: the trainer never imports a preset.
        "reward": {"custom_fn": tiny_task.SCORE_FN},
        "checkpoint": {
            "dir": str(workdir / "checkpoints"),
            "save_freq": 10,
            "max_to_keep": 2,
            "resume": "auto",
            "export_hf": True,  # as the model profiles: HF weights at every save
        },
        "logging": {"dir": str(workdir / "runs")},
    }
