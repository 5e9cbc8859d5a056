"""Rewards: a registry keyed by data_source, built-in rule-based rewards (math, geometry3k,
gsm8k) and a manager that scores batches without letting a bad reward stop the run."""

from grpo_trainer.rewards import geo3k, gsm8k, math_answer  # noqa: F401  (registers the built-ins)
from grpo_trainer.rewards.custom import CustomRewardError, load_custom_fn
from grpo_trainer.rewards.geo3k import geo3k_score, geo3k_score_lenient
from grpo_trainer.rewards.gsm8k import gsm8k_score, gsm8k_score_lenient
from grpo_trainer.rewards.manager import RewardItem, RewardManager, RewardResult
from grpo_trainer.rewards.math_answer import answers_match, last_boxed, math_score, normalize_answer
from grpo_trainer.rewards.registry import (
    GraderUnavailableError,
    RewardFn,
    UnknownDataSourceError,
    get_reward_fn,
    register,
    registered_sources,
    unregister,
)

__all__ = [
    "CustomRewardError",
    "GraderUnavailableError",
    "RewardFn",
    "RewardItem",
    "RewardManager",
    "RewardResult",
    "UnknownDataSourceError",
    "answers_match",
    "geo3k_score",
    "geo3k_score_lenient",
    "get_reward_fn",
    "gsm8k_score",
    "gsm8k_score_lenient",
    "last_boxed",
    "load_custom_fn",
    "math_score",
    "normalize_answer",
    "register",
    "registered_sources",
    "unregister",
]
