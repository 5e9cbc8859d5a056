"""The parallel layout a checkpoint was saved at, and what a resume may change.

A Megatron checkpoint is a distributed checkpoint (`backends/megatron/state.py`): it loads at other
tensor/pipeline/expert-parallel sizes, resharded on load, and the run says so in its log. What it
cannot serve is the other backend, the other Megatron optimizer (distributed or not), or a Megatron
run when it holds no Megatron state (saved without 'model' in `checkpoint.save_contents`, or by
grpo's earlier per-shard format): these are refused before any worker starts. Pure (reads the step
directory): the launchers' preflight calls it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_config.schema import TrainerConfig
from grpo_trainer.backends.megatron.state import STATE_DIRECTORY as MEGATRON_STATE

LAYOUT_KEY = "parallel_layout"


class ResumeLayoutError(ValueError):
    """A resume the checkpoint cannot serve (another backend or optimizer kind, no Megatron state)."""


def checkpoint_layout(cfg: TrainerConfig) -> dict[str, Any]:
    """What a checkpoint of this run records: the backend and, for Megatron, the model-parallel
    sizes (data parallelism excluded)."""
    layout: dict[str, Any] = {"backend": cfg.actor.backend}
    if cfg.actor.backend == "megatron":
        p = cfg.parallel
        layout.update(tp=p.tp, pp=p.pp, vpp=p.vpp or 1, ep=p.ep, etp=p.etp, cp=p.cp)
        # The distributed optimizer stores fp32 copies of the weights the other one does not.
        layout["distributed_optimizer"] = cfg.actor.megatron.use_distributed_optimizer
    return layout


def resume_layout_problem(cfg: TrainerConfig, step_dir: str | Path) -> str | None:
    """Why `cfg` cannot resume from the checkpoint at `step_dir`, or None (also when the checkpoint
    predates the layout record)."""
    saved = saved_layout(step_dir)
    ours = checkpoint_layout(cfg)
    way_out = (
        f"start from its HF export (actor.model_path={Path(step_dir) / 'huggingface'} checkpoint.resume=none; "
        "the optimizer state and step count start anew)"
    )
    if saved is not None and saved.get("backend") != ours["backend"]:
        return (
            f"checkpoint {step_dir} was saved by actor.backend={saved.get('backend')}; this run uses "
            f"actor.backend={ours['backend']}. Resume with the backend it was saved with, or {way_out}"
        )
    saved_distributed = (saved or {}).get("distributed_optimizer")
    if ours["backend"] == "megatron" and saved_distributed not in (None, ours["distributed_optimizer"]):
        return (
            f"checkpoint {step_dir} was saved with actor.megatron.use_distributed_optimizer={saved_distributed}: "
            f"set it so to resume (the two optimizers store their state differently), or {way_out}"
        )
    if saved is not None and ours["backend"] == "megatron" and not (Path(step_dir) / MEGATRON_STATE).is_dir():
        return (
            f"checkpoint {step_dir} holds no Megatron state ({MEGATRON_STATE}/): it was saved without 'model' in "
            f"checkpoint.save_contents or by an earlier grpo version. Resume from another checkpoint, or {way_out}"
        )
    return None


def layout_change(cfg: TrainerConfig, step_dir: str | Path | None) -> str | None:
    """"tp=2 ep=2 -> tp=1 ep=1" when a Megatron checkpoint is resumed at other model-parallel sizes
    (its state is resharded on load), else None."""
    saved = saved_layout(step_dir) if step_dir is not None else None
    ours = checkpoint_layout(cfg)
    if saved is None or saved == ours or saved.get("backend") != ours["backend"]:
        return None
    changed = [k for k in ours if saved.get(k) != ours[k]]
    return f"{_describe({k: saved.get(k) for k in changed})} -> {_describe({k: ours[k] for k in changed})}"


def saved_layout(step_dir: str | Path) -> dict[str, Any] | None:
    state_file = Path(step_dir) / "trainer_state.json"
    return json.loads(state_file.read_text()).get(LAYOUT_KEY) if state_file.is_file() else None


def check_resume_layout(cfg: TrainerConfig, step_dir: str | Path | None) -> None:
    if step_dir is None:
        return
    problem = resume_layout_problem(cfg, step_dir)
    if problem:
        raise ResumeLayoutError(problem)


def _describe(layout: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in layout.items())
