"""The parallel layout a checkpoint was saved at, and the check that a resume asks the same one.

A Megatron checkpoint holds one state per tensor/pipeline/expert-parallel shard (and per virtual
pipeline chunk); the data-parallel size may change between runs, those sizes may not. So the layout
is recorded in every save's trainer state and compared before any worker starts, rather than found
out once every rank has built its model. Pure (reads one JSON file): the launchers' preflight calls
it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_config.schema import TrainerConfig

LAYOUT_KEY = "parallel_layout"


class ResumeLayoutError(ValueError):
    """A resume at other model-parallel sizes than the checkpoint's."""


def checkpoint_layout(cfg: TrainerConfig) -> dict[str, Any]:
    """What a checkpoint of this run depends on: the backend and, for Megatron, the model-parallel
    sizes (data parallelism excluded)."""
    layout: dict[str, Any] = {"backend": cfg.actor.backend}
    if cfg.actor.backend == "megatron":
        p = cfg.parallel
        layout.update(tp=p.tp, pp=p.pp, vpp=p.vpp or 1, ep=p.ep, etp=p.etp, cp=p.cp)
    return layout


def resume_layout_problem(cfg: TrainerConfig, step_dir: str | Path) -> str | None:
    """Why `cfg` cannot resume from the checkpoint at `step_dir`, or None (also when the checkpoint
    predates the record)."""
    state_file = Path(step_dir) / "trainer_state.json"
    saved = json.loads(state_file.read_text()).get(LAYOUT_KEY) if state_file.is_file() else None
    ours = checkpoint_layout(cfg)
    if saved is None or saved == ours:
        return None
    return (
        f"checkpoint {step_dir} was saved at {_describe(saved)}; this run asks {_describe(ours)}. A Megatron "
        "checkpoint holds one state per tensor/pipeline/expert-parallel shard: resume with the parallel.* sizes "
        "it was saved at (the data-parallel size may change), or start from its HF export "
        f"(actor.model_path={Path(step_dir) / 'huggingface'} checkpoint.resume=none; the optimizer state and "
        "step count start anew)"
    )


def check_resume_layout(cfg: TrainerConfig, step_dir: str | Path | None) -> None:
    if step_dir is None:
        return
    problem = resume_layout_problem(cfg, step_dir)
    if problem:
        raise ResumeLayoutError(problem)


def _describe(layout: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in layout.items())
