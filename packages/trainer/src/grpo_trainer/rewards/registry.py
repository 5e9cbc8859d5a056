"""Reward functions keyed by `data_source`.

A reward function is `fn(solution_str, ground_truth, extra_info) -> float` (a bool, an int or a
mapping with a "score" key are accepted too). Register one with `@register("my/source", ...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

RewardFn = Callable[[str, Any, Mapping[str, Any] | None], Any]

_REGISTRY: dict[str, RewardFn] = {}


class UnknownDataSourceError(ValueError):
    """No reward function is registered for a data source."""


def _same_function(a: RewardFn, b: RewardFn) -> bool:
    # A module imported twice (reload, a worker process) re-registers an equal function.
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def register(*data_sources: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function for one or more data sources."""
    if not data_sources or not all(isinstance(s, str) and s for s in data_sources):
        raise ValueError(f"register() needs one or more non-empty data source names, got {data_sources!r}")

    def decorator(fn: RewardFn) -> RewardFn:
        for source in data_sources:
            existing = _REGISTRY.get(source)
            if existing is not None and not _same_function(existing, fn):
                raise ValueError(
                    f"data source {source!r} already has reward function {existing.__qualname__} "
                    f"({existing.__module__}); call unregister({source!r}) first to replace it"
                )
            _REGISTRY[source] = fn
        return fn

    return decorator


def unregister(data_source: str) -> None:
    _REGISTRY.pop(data_source, None)


def get_reward_fn(data_source: str) -> RewardFn:
    fn = _REGISTRY.get(data_source)
    if fn is None:
        raise UnknownDataSourceError(
            f"no reward function for data_source {data_source!r}; known: {sorted(_REGISTRY)}. "
            "Register one with grpo_trainer.rewards.register or set reward.custom_fn='pkg.module:function'"
        )
    return fn


def registered_sources() -> list[str]:
    return sorted(_REGISTRY)
