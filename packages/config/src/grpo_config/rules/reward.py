"""The `reward` section: ranges and the overlong buffer against the response budget."""

from __future__ import annotations

from grpo_config.rules.common import Range, range_problems
from grpo_config.schema import TrainerConfig

RANGES: tuple[Range, ...] = (
    ("reward.overlong_buffer.len", lambda v: v >= 0, ">= 0 tokens"),
    ("reward.overlong_buffer.penalty_factor", lambda v: v >= 0, ">= 0"),
    (
        "reward.overlong_buffer.max_response_length",
        lambda v: v is None or v >= 1,
        ">= 1 tokens or null (the budget)",
    ),
    ("reward.timeout_s", lambda v: v > 0, "> 0 seconds"),
    ("reward.num_workers", lambda v: v >= 1, ">= 1"),
)


def reward_problems(cfg: TrainerConfig) -> list[str]:
    problems = range_problems(cfg, RANGES)
    buffer = cfg.reward.overlong_buffer
    budget = cfg.rollout.max_tokens or cfg.data.max_response_length
    if buffer.enable and buffer.max_response_length is not None:
        if not 1 <= buffer.len <= buffer.max_response_length:
            problems.append(
                f"reward.overlong_buffer.len={buffer.len} must be between 1 and reward.overlong_buffer."
                f"max_response_length={buffer.max_response_length} (verl's max_resp_len): the penalty ramps over "
                "the last len tokens before it."
            )
    elif buffer.enable and not 1 <= buffer.len <= budget:
        problems.append(
            f"reward.overlong_buffer.len={buffer.len} must be between 1 and the response budget {budget} "
            "(rollout.max_tokens, else data.max_response_length): the penalty ramps over the last len tokens."
        )
    if cfg.reward.custom_fn_name != "compute_score":
        if cfg.reward.custom_fn is None:
            problems.append(
                f"reward.custom_fn_name={cfg.reward.custom_fn_name!r} names a function of reward.custom_fn, which "
                "is not set (verl's custom_reward_function.path): set the file, or remove the name."
            )
        elif ":" in cfg.reward.custom_fn:
            problems.append(
                f"reward.custom_fn={cfg.reward.custom_fn!r} names its function already; reward.custom_fn_name="
                f"{cfg.reward.custom_fn_name!r} would be a second: keep one."
            )
    return problems
