"""Checks `train` makes before anything heavy starts: a model path that is a model, a checkpoint
to resume that is not past the run's last step."""

from __future__ import annotations

import json
from pathlib import Path


class ModelPathError(ValueError):
    """actor.model_path names a local directory that is not a Hugging Face model."""


class TargetStepPassedError(ValueError):
    """The checkpoint to resume is past the run's last step."""


def check_model_path(model_path: str) -> None:
    """Refuse a local `model_path` that is not a model directory before anything is loaded (a hub id,
    `org/name`, is left to transformers)."""
    path = Path(model_path).expanduser()
    local = path.is_absolute() or model_path.startswith((".", "~")) or path.exists()
    if not local or (path / "config.json").is_file():
        return
    what = "does not exist" if not path.exists() else "has no config.json (it is not a Hugging Face model directory)"
    raise ModelPathError(
        f"actor.model_path={model_path}: {path} {what}. Point actor.model_path (MODEL_PATH for the "
        "launchers) at a downloaded model, e.g. `hf download <org>/<model> --local-dir <dir>`."
    )


def check_target_step(step_dir: Path, *, total_steps: int) -> None:
    """Refuse to resume a checkpoint past the run's last step (a run cannot train backwards)."""
    step = int(json.loads((step_dir / "trainer_state.json").read_text())["global_step"])
    if step > total_steps:
        raise TargetStepPassedError(
            f"checkpoint.resume found {step_dir} at step {step}, past this run's last step {total_steps} "
            f"(total_training_steps, else total_epochs x steps per epoch): there is nothing to train. Raise "
            f"total_training_steps above {step} to train on, or start the run in another folder."
        )
