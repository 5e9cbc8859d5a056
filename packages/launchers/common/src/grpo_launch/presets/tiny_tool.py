"""The `tiny-tool` preset: the tiny preset's run with multi-turn rollouts (docs/MULTI_TURN.md). The
task (`grpo_tiny.tool_task`) asks for a key's secret digit, which only the `lookup` tool knows: the
model learns to write the call (`<tool_call>` in Qwen3.5's format, its fixed parts a token each),
with the prompt's key, and to copy the digit the tool answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_launch.presets.tiny import ensure_data, tiny_config
from grpo_tiny import model as tiny_model
from grpo_tiny import tool_task


def tiny_tool_preset(workdir: Path) -> dict[str, Any]:
    """Build (if missing) the tiny model with a tool-calling tokenizer and the task's data under
    `workdir`; the tiny preset's config with multi-turn rollouts and the lookup tool."""
    workdir = Path(workdir).resolve()
    model_dir = tiny_model.ensure_tiny_model(
        workdir / "model", texts=tool_task.corpus(), vocab_size=56, tools=True, call=tool_task.CALL
    )
    train_file, val_file = ensure_data(workdir / "data", tool_task.make_rows)
    config = tiny_config(workdir, model_dir=model_dir, train_file=train_file, val_file=val_file)
    config["experiment_name"] = "tiny_tool"
    # Calls take over near step 85, the final answer's copy of the digit by ~120 (docs/MULTI_TURN.md).
    config["total_training_steps"] = 125
    config["data"].update({"max_prompt_length": 16, "max_response_length": 48})
    config["rollout"]["multi_turn"] = {
        "enable": True,
        "tools": [],
        "function_tool_path": str(tool_task.TOOL_FILE),
        "max_assistant_turns": 2,
        "max_tool_response_length": 16,
    }
    config["reward"] = {"custom_fn": tool_task.SCORE_FN}
    return config
