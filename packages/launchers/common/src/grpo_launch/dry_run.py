"""`--dry-run`: the resolved launch as YAML on stdout: what runs where, the world it needs, the
device memory per rank it plans (`grpo_launch.memory_plan`), the environment it sets and the full
config. Deterministic for a given plan and environment, so a
snapshot of it is a meaningful test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

import grpo_config
from grpo_launch.plan import PROXY_VARS, TINY_PRESETS, LaunchPlan, env_kept
from grpo_launch.preflight import memory_plan


def world_summary(plan: LaunchPlan) -> dict[str, Any]:
    cfg = plan.config
    par = cfg.parallel
    world = plan.world_size
    model_parallel = par.tp * par.pp * par.cp
    replicas = grpo_config.RolloutReplicas.for_config(cfg)
    return {
        "nnodes": cfg.device.nnodes,
        "devices_per_node": cfg.device.devices_per_node,
        "world_size": world,
        "actor": {"tp": par.tp, "pp": par.pp, "cp": par.cp, "ep": par.ep, "etp": par.etp, "vpp": par.vpp},
        "data_parallel": world // model_parallel,
        "expert_data_parallel": world // (par.pp * par.ep * par.etp),
        "rollout": _rollout_summary(cfg, replicas),
    }


def _rollout_summary(cfg: Any, replicas: grpo_config.RolloutReplicas) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "mode": cfg.rollout.mode,
        "tensor_parallel_size": replicas.tensor_parallel_size,
        "replicas": replicas.count,
    }
    if cfg.rollout.mode == "one_step_off":  # rollout workers on devices beside the training world
        summary["rollout_workers"] = {
            "nnodes": cfg.rollout.nnodes,
            "devices_per_node": cfg.rollout.devices_per_node,
            "devices": replicas.world_size,
        }
    else:
        summary["ranks_of_each_replica"] = replicas.describe()
    return summary


def steps_summary(plan: LaunchPlan) -> list[str]:
    if plan.preset in TINY_PRESETS:
        return [f"build the {plan.preset} model and task under {plan.output_dir}", "apply the environment", "train"]
    assert plan.data is not None
    data = plan.data
    prepare = (
        f"prepare {data.dataset} into {data.directory} from {data.source} if missing"
        if data.prepare_if_missing
        else "check TRAIN_FILES and VAL_FILES exist"
    )
    return [
        "check the model path",
        prepare,
        f"unset {', '.join(PROXY_VARS)}",
        "apply the environment (variables you exported win)",
        "train",
    ]


def render_dry_run(plan: LaunchPlan, *, environ: Mapping[str, str]) -> str:
    doc = {
        "launch": {
            "launcher": plan.launcher,
            "model": plan.model_id,
            "preset": plan.preset,
            "device": plan.device,
            "output_dir": str(plan.output_dir),
            "steps": steps_summary(plan),
        },
        "world": world_summary(plan),
        "memory_plan": memory_plan(plan),
        "environment": {
            "set": dict(sorted(plan.env.items())),
            "kept_from_your_environment": env_kept(plan.env, environ),
        },
        "config": grpo_config.to_dict(plan.config),
    }
    header = f"# {plan.launcher} --dry-run: {plan.model_id}, {plan.preset} preset, device {plan.device}\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
