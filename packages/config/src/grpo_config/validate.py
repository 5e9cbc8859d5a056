"""Cross-field checks, run by `load` before anything heavy starts. Every problem says what to change."""

from __future__ import annotations

import dataclasses
import math

from grpo_config.errors import ConfigError
from grpo_config.schema import ParallelConfig, TimeoutsConfig, TrainerConfig

_TIMEOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TimeoutsConfig)}


def _positive(cfg: TrainerConfig) -> dict[str, int]:
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


def _parallel_problems(par: ParallelConfig, *, prefix: str, world: int, num_experts: int | None) -> list[str]:
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


def _batch_problems(cfg: TrainerConfig, *, world: int) -> list[str]:
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
        problems += _pipeline_problems(cfg, dp=dp)
    return problems


def _pipeline_problems(cfg: TrainerConfig, *, dp: int) -> list[str]:
    """Pipeline stages exchange activations of one fixed shape: every micro-batch must have the
    same number of rows (widths are padded to the batch's longest row)."""
    if cfg.actor.use_dynamic_bsz:
        return [
            f"actor.use_dynamic_bsz=true with parallel.pp={cfg.parallel.pp} is not supported: pipeline "
            "stages need micro-batches of one row count. Set actor.use_dynamic_bsz=false (micro-batches "
            "of actor.ppo_micro_batch_size_per_device rows) or parallel.pp=1."
        ]
    rows = cfg.data.train_batch_size * cfg.rollout.n // dp  # one data-parallel rank's rows per step
    sizes = {"actor.log_prob_micro_batch_size_per_device": cfg.actor.log_prob_micro_batch_size_per_device}
    if cfg.ref.log_prob_micro_batch_size_per_device is not None:
        sizes["ref.log_prob_micro_batch_size_per_device"] = cfg.ref.log_prob_micro_batch_size_per_device
    return [
        f"{key}={size} does not divide the {rows} rows each data-parallel rank computes log-probs for "
        f"(data.train_batch_size * rollout.n // data parallel size {dp}); with parallel.pp="
        f"{cfg.parallel.pp} every micro-batch needs the same row count: choose a divisor of {rows}."
        for key, size in sizes.items()
        if rows % size
    ]


def _value_problems(cfg: TrainerConfig) -> list[str]:
    problems: list[str] = []
    if not cfg.actor.clip_ratio_c > 1.0:
        problems.append(
            f"actor.clip_ratio_c={cfg.actor.clip_ratio_c} must be greater than 1 (dual-clip lower bound "
            f"of the PPO loss); the usual value is 3.0."
        )
    if not 0.0 < cfg.rollout.gpu_memory_utilization <= 1.0:
        problems.append(
            f"rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} must be in (0, 1], "
            f"e.g. 0.6."
        )
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        problems.append(f"rollout.top_p={cfg.rollout.top_p} must be in (0, 1].")
    for name, default in _TIMEOUT_DEFAULTS.items():
        seconds = getattr(cfg.timeouts, name)
        if not 0.0 < seconds < math.inf:
            problems.append(
                f"timeouts.{name}={seconds} must be a positive, finite number of seconds (how long the "
                f"driver waits for every rank in that phase before it stops the run): set "
                f"timeouts.{name} to e.g. {default:g}."
            )
    return problems


def validate(cfg: TrainerConfig, *, num_experts: int | None = None) -> None:
    """Raise ConfigError listing every cross-field problem of `cfg` (a config resolved by `load`).

    `num_experts`: the model's routed expert count, when known, so `parallel.ep` is checked against it.
    """
    problems = [
        f"{key}={value} must be a positive integer." for key, value in _positive(cfg).items() if value < 1
    ]
    if not problems:
        world = cfg.device.nnodes * cfg.device.devices_per_node
        problems += _parallel_problems(cfg.parallel, prefix="parallel", world=world, num_experts=num_experts)
        if cfg.ref.parallel is not None and cfg.ref.parallel != cfg.parallel:
            problems += _parallel_problems(
                cfg.ref.parallel, prefix="ref.parallel", world=world, num_experts=num_experts
            )
        problems += _batch_problems(cfg, world=world)
        if world % cfg.rollout.tensor_parallel_size:
            problems.append(
                f"rollout.tensor_parallel_size={cfg.rollout.tensor_parallel_size} does not divide the "
                f"world size {world} (device.nnodes * device.devices_per_node): choose a divisor of {world}."
            )
    problems += _value_problems(cfg)
    if problems:
        numbered = " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        plural = "problem" if len(problems) == 1 else "problems"
        raise ConfigError(f"Invalid config, {len(problems)} {plural}: {numbered}")
