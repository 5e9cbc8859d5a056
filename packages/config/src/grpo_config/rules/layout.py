"""The parallel layout against the world and the batch sizes: `parallel`, `device`, the batch keys of
`data` / `actor` / `ref`, rollout replicas, the Megatron reference model's layout."""

from __future__ import annotations

import dataclasses

from grpo_config.rules.common import changed_fields, value_of
from grpo_config.schema import (
    ParallelConfig,
    TrainerConfig,
)


def positive_sizes(cfg: TrainerConfig) -> dict[str, int]:
    sizes = {
        "device.nnodes": cfg.device.nnodes,
        "device.devices_per_node": cfg.device.devices_per_node,
        "data.train_batch_size": cfg.data.train_batch_size,
        "actor.ppo_mini_batch_size": cfg.actor.ppo_mini_batch_size,
        "actor.ppo_micro_batch_size_per_device": cfg.actor.ppo_micro_batch_size_per_device,
        "actor.log_prob_micro_batch_size_per_device": cfg.actor.log_prob_micro_batch_size_per_device,
        "rollout.n": cfg.rollout.n,
        "rollout.tensor_parallel_size": cfg.rollout.tensor_parallel_size,
    }
    for prefix, par in (("parallel", cfg.parallel), ("ref.parallel", cfg.ref.parallel)):
        if par is None:
            continue
        sizes.update({f"{prefix}.{name}": getattr(par, name) for name in ("tp", "pp", "ep", "etp", "cp")})
        if par.vpp is not None:
            sizes[f"{prefix}.vpp"] = par.vpp
    if cfg.ref.log_prob_micro_batch_size_per_device is not None:
        sizes["ref.log_prob_micro_batch_size_per_device"] = cfg.ref.log_prob_micro_batch_size_per_device
    return sizes


def parallel_problems(par: ParallelConfig, *, prefix: str, world: int, num_experts: int | None) -> list[str]:
    problems: list[str] = []
    model_parallel = par.tp * par.pp * par.cp
    if world % model_parallel:
        problems.append(
            f"{prefix}.tp * {prefix}.pp * {prefix}.cp = {par.tp}*{par.pp}*{par.cp} = {model_parallel} does "
            f"not divide the world size {world} (device.nnodes * device.devices_per_node): choose sizes "
            f"whose product divides {world}."
        )
    if world % par.pp == 0 and (world // par.pp) % (par.ep * par.etp):
        problems.append(
            f"{prefix}.ep * {prefix}.etp = {par.ep}*{par.etp} = {par.ep * par.etp} does not divide the "
            f"devices per pipeline stage, world // {prefix}.pp = {world}//{par.pp} = {world // par.pp}: "
            f"lower {prefix}.ep or {prefix}.etp to a divisor of {world // par.pp}."
        )
    if num_experts is not None and num_experts % par.ep:
        problems.append(
            f"{prefix}.ep={par.ep} does not divide the model's {num_experts} experts: set {prefix}.ep "
            f"to a divisor of {num_experts}."
        )
    if par.vpp is not None and par.pp == 1:
        problems.append(
            f"{prefix}.vpp={par.vpp} needs pipeline parallelism: set {prefix}.pp > 1 or {prefix}.vpp=null."
        )
    return problems


def batch_problems(cfg: TrainerConfig, *, world: int) -> list[str]:
    problems: list[str] = []
    train, mini = cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size
    if train % mini:
        problems.append(
            f"data.train_batch_size={train} is not divisible by actor.ppo_mini_batch_size={mini}: make "
            f"data.train_batch_size a multiple of {mini} or actor.ppo_mini_batch_size a divisor of {train}."
        )
    par = cfg.parallel
    if world % (par.tp * par.pp * par.cp):
        return problems  # data parallel size undefined; reported by the parallel check
    dp = world // (par.tp * par.pp * par.cp)
    micro = 1 if cfg.actor.use_dynamic_bsz else cfg.actor.ppo_micro_batch_size_per_device
    sequences = mini * cfg.rollout.n
    if sequences % (micro * dp):
        what = (
            "data parallel size"
            if cfg.actor.use_dynamic_bsz
            else f"actor.ppo_micro_batch_size_per_device * data parallel size = {micro}*{dp}"
        )
        problems.append(
            f"actor.ppo_mini_batch_size * rollout.n = {mini}*{cfg.rollout.n} = {sequences} sequences per "
            f"mini batch is not divisible by {what} = {micro * dp} (data parallel size = world {world} "
            f"// (parallel.tp*pp*cp) {par.tp * par.pp * par.cp}): change actor.ppo_mini_batch_size, "
            f"rollout.n or actor.ppo_micro_batch_size_per_device."
        )
    if cfg.actor.backend == "megatron" and par.pp > 1:
        problems += pipeline_problems(cfg, dp=dp)
    return problems


def pipeline_problems(cfg: TrainerConfig, *, dp: int) -> list[str]:
    """Pipeline stages exchange activations of one fixed shape: every micro-batch must have the
    same number of rows (widths are padded to the batch's longest row)."""
    policy_log_probs = not cfg.algorithm.rollout_correction.bypass_mode or cfg.uses_reference_model
    dynamic = [
        key
        for key, on in (
            ("actor.use_dynamic_bsz", cfg.actor.use_dynamic_bsz),
            ("actor.log_prob_use_dynamic_bsz", cfg.actor.log_prob_use_dynamic_bsz and policy_log_probs),
            ("ref.log_prob_use_dynamic_bsz", cfg.ref.log_prob_use_dynamic_bsz and cfg.uses_reference_model),
        )
        if on
    ]
    if dynamic:
        return [
            f"{' and '.join(f'{key}=true' for key in dynamic)} with parallel.pp={cfg.parallel.pp} is not "
            "supported: pipeline stages need micro-batches of one row count. Set "
            f"{' and '.join(f'{key}=false' for key in dynamic)} (micro-batches of "
            "actor.ppo_micro_batch_size_per_device / log_prob_micro_batch_size_per_device rows) or "
            "parallel.pp=1."
        ]
    rows = cfg.data.train_batch_size * cfg.rollout.n // dp  # one data-parallel rank's rows per step
    sizes = (
        {"actor.log_prob_micro_batch_size_per_device": cfg.actor.log_prob_micro_batch_size_per_device}
        if policy_log_probs
        else {}
    )
    if cfg.ref.log_prob_micro_batch_size_per_device is not None and cfg.uses_reference_model:
        sizes["ref.log_prob_micro_batch_size_per_device"] = cfg.ref.log_prob_micro_batch_size_per_device
    problems = [
        f"{key}={size} does not divide the {rows} rows each data-parallel rank computes log-probs for "
        f"(data.train_batch_size * rollout.n // data parallel size {dp}); with parallel.pp="
        f"{cfg.parallel.pp} every micro-batch needs the same row count: choose a divisor of {rows}."
        for key, size in sizes.items()
        if rows % size
    ]
    if problems or not (cfg.parallel.vpp and cfg.parallel.vpp > 1):
        return problems
    return interleaving_problems(cfg, dp=dp, log_prob_sizes=sizes, rows=rows)


def interleaving_problems(
    cfg: TrainerConfig, *, dp: int, log_prob_sizes: dict[str, int], rows: int
) -> list[str]:
    """megatron-core's interleaved schedule (parallel.vpp > 1) runs micro-batches in groups of PP:
    every pass needs a multiple of PP micro-batches (it raises otherwise)."""
    pp = cfg.parallel.pp
    counts = {
        "actor.ppo_micro_batch_size_per_device": (
            cfg.actor.ppo_mini_batch_size * cfg.rollout.n // dp // cfg.actor.ppo_micro_batch_size_per_device,
            "an update's",
        )
    }
    counts.update({key: (rows // size, "a log-prob pass's") for key, size in log_prob_sizes.items()})
    return [
        f"{key}={value_of(cfg, key)} makes {count} micro-batches in {what} pipeline, not a multiple of "
        f"parallel.pp={pp}: with parallel.vpp={cfg.parallel.vpp} megatron-core's interleaved schedule runs "
        f"micro-batches in groups of {pp}. Choose a micro-batch size that gives a multiple of {pp}, or parallel.vpp=null."
        for key, (count, what) in counts.items()
        if count % pp
    ]


def megatron_reference_problems(cfg: TrainerConfig) -> list[str]:
    problems: list[str] = []
    if cfg.ref.parallel not in (None, cfg.parallel):
        # One problem per field: from-verl judges each line by the problems it adds, so a script whose
        # actor and reference layouts agree but for one refused field loses that field's lines only.
        names = [f.name for f in dataclasses.fields(ParallelConfig)]
        problems.extend(
            f"{field}: ref.parallel differs from parallel ({name}={getattr(cfg.parallel, name)!r}): the "
            "Megatron reference model shares the actor's parallel layout (one set of process groups). "
            "Remove ref.parallel (it inherits parallel)."
            for name in names
            for field in changed_fields(cfg.ref.parallel, cfg.parallel, [name], "ref.parallel")
        )
    if cfg.parallel.cp > 1:
        problems.append(
            f"parallel.cp={cfg.parallel.cp}: context parallelism is not supported by the Megatron "
            f"backend's log-prob path yet. Set parallel.cp=1."
        )
    return problems


def replica_problems(cfg: TrainerConfig) -> list[str]:
    """A rollout replica spans `rollout.tensor_parallel_size` consecutive ranks of one node."""
    if cfg.rollout.mode == "one_step_off":
        return []  # one engine per rollout device (checked in one_step_off_problems)
    k = cfg.rollout.tensor_parallel_size
    per_node = cfg.device.devices_per_node
    world = cfg.device.world_size
    if world % k:
        return [
            f"rollout.tensor_parallel_size={k} does not divide the world size {world} "
            f"(device.nnodes * device.devices_per_node): choose a divisor of {world}."
        ]
    if per_node % k:
        return [
            f"rollout.tensor_parallel_size={k} does not divide device.devices_per_node={per_node}: a "
            f"rollout replica spans {k} consecutive ranks of one node (its tensor-parallel traffic stays "
            f"on the node's links); choose a divisor of {per_node}."
        ]
    return []
