"""The `tiny-vl` preset: the tiny preset's run on a vision-language model and a visual task, on the
CPU in minutes: `Qwen3_5MoeForConditionalGeneration` shrunk (the tiny language model and a
one-block vision tower, `tiny_vl_model`) counts coloured squares (`tiny_vl_task`). Images go
through the model's processor, the `hf` rollout engine and the torch backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_launch.presets.tiny import ensure_data, tiny_config
from grpo_tiny import vl_model as tiny_vl_model
from grpo_tiny import vl_task as tiny_vl_task


def tiny_vl_preset(workdir: Path) -> dict[str, Any]:
    """Build (if missing) the tiny VL model, its processor and the parquet data (images inline)
    under `workdir`, and return the nested config for `grpo_config.load`: the tiny preset's, with
    this model, this data and prompts long enough for an image's tokens."""
    workdir = Path(workdir).resolve()
    model_dir = tiny_vl_model.ensure_tiny_vl_model(workdir / "model", texts=tiny_vl_task.corpus())
    train_file, val_file = ensure_data(workdir / "data", tiny_vl_task.make_rows)
    config = tiny_config(workdir, model_dir=model_dir, train_file=train_file, val_file=val_file)
    config["experiment_name"] = "tiny_vl"
    config["data"]["max_prompt_length"] = 16  # an image's 4 tokens, its vision span and the question
    return config
