"""Carry out a launch plan's common steps, the same for every device: check the model, prepare the
data when it is missing from the default location, drop proxy variables, apply the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import structlog

import grpo_device
from grpo_launch.errors import LaunchError
from grpo_launch.plan import PROXY_VARS, TINY_PRESETS, DataPlan, LaunchPlan
from grpo_launch.profile import DEVICE_KINDS

log = structlog.get_logger()


def model_problem(plan: LaunchPlan) -> str | None:
    """Why the model path cannot be used, with how to fix it; None when it looks like an HF model."""
    path = Path(plan.config.actor.model_path).expanduser()
    if (path / "config.json").is_file():
        return None
    what = (
        "does not exist" if not path.exists() else "has no config.json (not a Hugging Face model directory)"
    )
    return (
        f"model path {path} {what}. Download the weights with `hf download {plan.model_id} "
        f"--local-dir {path}`, or set MODEL_PATH to the directory that holds them."
    )


def data_problem(data: DataPlan, *, will_prepare: bool) -> str | None:
    """Which data files are missing and how to build them; None when all exist (or will be built)."""
    missing = [f for f in (*data.train_files, *data.val_files) if not Path(f).expanduser().is_file()]
    if not missing or (will_prepare and data.prepare_if_missing):
        return None
    return (
        f"data files missing: {', '.join(missing)}. Build them with `hatch run prepare-data --dataset "
        f"{data.dataset} --out {data.directory}` (add `--source DIR` for a local copy of the dataset), "
        "or set TRAIN_FILES and VAL_FILES to existing verl-format parquet files."
    )


def preflight_problems(plan: LaunchPlan) -> list[str]:
    """What a real launch of `plan` would stop on (the tiny preset builds its own model and data)."""
    if plan.preset in TINY_PRESETS or plan.data is None:
        return []
    problems = [
        model_problem(plan),
        data_problem(plan.data, will_prepare=True),
        memory_plan(plan).get("refused"),
        resume_problem(plan),
    ]
    return [p for p in problems if p]


def resume_problem(plan: LaunchPlan) -> str | None:
    """A resume the checkpoint cannot serve (the other backend or optimizer kind, no Megatron state), said
    before launch; other Megatron parallel sizes are resharded on load."""
    from grpo_ckpt import CheckpointManager
    from grpo_trainer.driver.resume_layout import resume_layout_problem

    ckpt = plan.config.checkpoint
    try:
        step_dir = CheckpointManager(ckpt.dir).resolve_resume(ckpt.resume)
    except ValueError as exc:  # an explicit resume path that is no checkpoint
        return str(exc)
    return resume_layout_problem(plan.config, step_dir) if step_dir is not None else None


def preflight_warnings(plan: LaunchPlan) -> list[str]:
    """What a real launch would warn about but run with (a checkpoint of another architecture)."""
    if plan.preset in TINY_PRESETS:
        return []
    return architecture_warnings(memory_plan(plan).get("model_config", {}), model_id=plan.model_id)


def memory_plan(plan: LaunchPlan) -> dict[str, Any]:
    """The dry run's memory plan of a full launch (device size: device.memory_gib; the launch
    itself reads the device), with `refused` when it does not fit."""
    from grpo_launch.memory_plan import plan_for_launch

    if plan.preset in TINY_PRESETS:
        return {"skipped": "the tiny presets build their model at launch"}
    memory = plan_for_launch(plan.config, device_bytes=None, architecture=plan.architecture)
    if isinstance(memory, str):
        return {"skipped": memory}
    out = memory.to_dict()
    if memory.device_bytes is None:
        out["notes"].append("fit checked at launch against the device (or set device.memory_gib)")
    refusal = memory.refusal()
    return {**out, **({"refused": refusal} if refusal else {})}


def architecture_warnings(model_config: Mapping[str, Any], *, model_id: str) -> list[str]:
    """A checkpoint whose architecture differs from the model the profile was made for: said, not
    refused (a fine-tune or a sibling model may be meant), with each differing value."""
    differences = model_config.get("differs_from_shipped") or {}
    if not differences:
        return []
    listing = "; ".join(f"{key}: yours {d['yours']}, {model_id} {d['shipped']}" for key, d in differences.items())
    return [
        f"the checkpoint at {model_config['path']} is not {model_id}'s architecture ({listing}). The memory "
        f"plan counts your checkpoint; the launcher's parallel sizes and batch settings were chosen for "
        f"{model_id}: check them, or point MODEL_PATH at {model_id}."
    ]


def ensure_data(data: DataPlan) -> None:
    """Build the default data files when they are missing; user-given files must already exist."""
    if data_problem(data, will_prepare=False) is None:
        return
    if not data.prepare_if_missing:
        problem = data_problem(data, will_prepare=False)
        assert problem is not None
        raise LaunchError(problem)
    from grpo_launch.prepare_data import prepare_dataset  # `python -m` runs that module too

    log.info("preparing data", dataset=data.dataset, source=data.source, into=str(data.directory))
    prepare_dataset(data.dataset, output_dir=data.directory, source=data.source)
    problem = data_problem(data, will_prepare=False)
    if problem is not None:
        raise LaunchError(problem)


def unset_proxies(environ: MutableMapping[str, str]) -> list[str]:
    removed = [name for name in PROXY_VARS if environ.pop(name, None) is not None]
    if removed:
        log.info("proxy variables unset for the cluster traffic", names=removed)
    return removed


def check_device_usable(plan: LaunchPlan, environ: MutableMapping[str, str]) -> None:
    """Fail before any work when the chosen accelerator is not usable in this process. Skipped when
    joining a Ray cluster (`RAY_ADDRESS`): the driver may run on a node without accelerators."""
    if plan.device == "cpu" or environ.get("RAY_ADDRESS"):
        return
    grpo_device.detect(environ={"DEVICE": plan.device})  # raises DeviceUnavailableError with the fix


def check_memory_plan(plan: LaunchPlan, environ: MutableMapping[str, str]) -> None:
    """Refuse, with the numbers, a launch whose memory plan does not fit one device (its size:
    device.memory_gib, else this process's device 0; unchecked when neither is known)."""
    from grpo_launch.memory_plan import plan_for_launch

    device_bytes = None
    if plan.device != "cpu" and not environ.get("RAY_ADDRESS"):
        device_bytes = grpo_device.total_memory_bytes(DEVICE_KINDS[plan.device])
    memory = plan_for_launch(plan.config, device_bytes=device_bytes, architecture=plan.architecture)
    if isinstance(memory, str):
        log.warning("memory plan", skipped=memory)
        return
    log.info("memory plan", **memory.to_dict())
    for warning in architecture_warnings(memory.model_config, model_id=plan.model_id):
        log.warning("check the model", warning=warning)
    refusal = memory.refusal()
    if refusal:
        raise LaunchError(refusal)


def run_common_steps(plan: LaunchPlan, *, environ: MutableMapping[str, str] | None = None) -> None:
    """Every device, in order: device check, resume layout, model check, data, proxies, environment
    profile."""
    environ = os.environ if environ is None else environ
    check_device_usable(plan, environ)
    resume = resume_problem(plan)
    if resume:
        raise LaunchError(resume)
    if plan.preset == "full":
        problem = model_problem(plan)
        if problem:
            raise LaunchError(problem)
        check_memory_plan(plan, environ)
        assert plan.data is not None
        ensure_data(plan.data)
    unset_proxies(environ)
    kind = grpo_device.DeviceKind(DEVICE_KINDS[plan.device])
    profile = grpo_device.EnvProfile.for_device(kind).with_overrides(**plan.env)
    profile.apply(environ=environ)
