"""The `tiny-vl` preset: the tiny preset's run on a vision-language model and a visual task, on the
CPU in minutes: `Qwen3_5MoeForConditionalGeneration` shrunk (the tiny language model and a
one-block vision tower, `tiny_vl_model`) counts coloured squares (`tiny_vl_task`). Images go
through the model's processor, the `hf` rollout engine and the torch backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_launch.presets import tiny_vl_model, tiny_vl_task
from grpo_launch.presets.tiny import tiny_config

TRAIN_ROWS = 256
VAL_ROWS = 32


def tiny_vl_preset(workdir: Path) -> dict[str, Any]:
    """Build (if missing) the tiny VL model, its processor and the parquet data (images inline)
    under `workdir`, and return the nested config for `grpo_config.load`: the tiny preset's, with
    this model, this data and prompts long enough for an image's tokens."""
    workdir = Path(workdir).resolve()
    model_dir = tiny_vl_model.ensure_tiny_vl_model(workdir / "model", texts=tiny_vl_task.corpus())
    data_dir = workdir / "data"
    train_file, val_file = data_dir / "train.parquet", data_dir / "val.parquet"
    if not train_file.exists():
        tiny_vl_task.write_rows(tiny_vl_task.make_rows(count=TRAIN_ROWS, seed=0, split="train"), train_file)
    if not val_file.exists():
        tiny_vl_task.write_rows(tiny_vl_task.make_rows(count=VAL_ROWS, seed=1, split="val"), val_file)
    config = tiny_config(workdir, model_dir=model_dir, train_file=train_file, val_file=val_file)
    config["experiment_name"] = "tiny_vl"
    config["data"]["max_prompt_length"] = 16  # an image's 4 tokens, its vision span and the question
    return config
