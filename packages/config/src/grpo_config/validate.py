"""Cross-field checks, run by `load` before anything heavy starts. Every problem says what to change;
the rules live in `grpo_config.rules`, by the section they check."""

from __future__ import annotations

from grpo_config.errors import ConfigError
from grpo_config.rules.actor import actor_problems
from grpo_config.rules.algorithm import algorithm_problems, no_signal_problems
from grpo_config.rules.data import data_problems
from grpo_config.rules.inert import inert_settings
from grpo_config.rules.layout import batch_problems, parallel_problems, positive_sizes, replica_problems
from grpo_config.rules.megatron import megatron_problems
from grpo_config.rules.reward import reward_problems
from grpo_config.rules.rollout import rollout_problems
from grpo_config.rules.run import run_problems
from grpo_config.schema import TrainerConfig

__all__ = ["inert_settings", "validate", "value_problems"]


def validate(cfg: TrainerConfig, *, num_experts: int | None = None) -> None:
    """Raise ConfigError listing every cross-field problem of `cfg` (a config resolved by `load`).

    `num_experts`: the model's routed expert count, when known, so `parallel.ep` is checked against it.
    """
    problems = no_signal_problems(cfg)
    problems += [
        f"{key}={value} must be a positive integer." for key, value in positive_sizes(cfg).items() if value < 1
    ]
    if not problems:
        world = cfg.device.world_size
        # ref.parallel may only repeat parallel (megatron_problems refuses a different layout).
        problems += parallel_problems(cfg.parallel, prefix="parallel", world=world, num_experts=num_experts)
        problems += batch_problems(cfg, world=world)
        problems += replica_problems(cfg)
    if cfg.device.memory_gib is not None and not cfg.device.memory_gib > 0:
        problems.append(f"device.memory_gib={cfg.device.memory_gib} must be > 0 (GiB of one device), or null to read it")
    problems += value_problems(cfg)
    if problems:
        numbered = " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        plural = "problem" if len(problems) == 1 else "problems"
        raise ConfigError(f"Invalid config, {len(problems)} {plural}: {numbered}")


def value_problems(cfg: TrainerConfig) -> list[str]:
    """Every section's own rules (ranges, values grpo cannot honour, settings the chosen backend
    or engine never reads), section by section; the layout's are `validate`'s."""
    return (
        actor_problems(cfg)
        + megatron_problems(cfg)
        + data_problems(cfg)
        + rollout_problems(cfg)
        + algorithm_problems(cfg)
        + reward_problems(cfg)
        + run_problems(cfg)
    )
