"""Reward functions keyed by `data_source`, per grader.

A reward function is `fn(solution_str, ground_truth, extra_info) -> float` (a bool, an int or a
mapping with a "score" key are accepted too). Register one with `@register("my/source", ...)`.

Graders (`reward.grader`): "verl" scores each built-in data source as verl's
`default_compute_score` does; "lenient" picks a function registered with `grader="lenient"` for
the source (grpo's broader answer matching), else the source's "verl" one. A source may also be
registered by prefix (`prefix=True`: verl scores every `aime*` source with its DAPO rule).
A function that grades with an optional library names its modules (`requires=`); it imports them
when first called, and `get_reward_fn` refuses it, naming the setting, when one is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any, Literal

RewardFn = Callable[[str, Any, Mapping[str, Any] | None], Any]
Grader = Literal["verl", "lenient"]
GRADERS: tuple[Grader, ...] = ("verl", "lenient")

_REGISTRY: dict[Grader, dict[str, RewardFn]] = {grader: {} for grader in GRADERS}
_PREFIXES: dict[Grader, dict[str, RewardFn]] = {grader: {} for grader in GRADERS}
_REQUIRES: dict[tuple[str, str], tuple[str, ...]] = {}  # (module, qualname) -> modules it imports


class UnknownDataSourceError(ValueError):
    """No reward function is registered for a data source."""


class GraderUnavailableError(ValueError):
    """The reward function `reward.grader` picks for a data source needs a module that is not installed."""


def _key(fn: RewardFn) -> tuple[str, str]:
    return getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is no package, or a module set to None
        return False


def _same_function(a: RewardFn, b: RewardFn) -> bool:
    # A module imported twice (reload, a worker process) re-registers an equal function.
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def register(
    *data_sources: str, grader: Grader = "verl", prefix: bool = False, requires: tuple[str, ...] = ()
) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function for one or more data sources (or source prefixes);
    `requires`: the top-level modules it imports when called (checked by `get_reward_fn`)."""
    if not data_sources or not all(isinstance(s, str) and s for s in data_sources):
        raise ValueError(f"register() needs one or more non-empty data source names, got {data_sources!r}")
    if grader not in GRADERS:
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    table = (_PREFIXES if prefix else _REGISTRY)[grader]

    def decorator(fn: RewardFn) -> RewardFn:
        for source in data_sources:
            existing = table.get(source)
            if existing is not None and not _same_function(existing, fn):
                raise ValueError(
                    f"data source {source!r} already has reward function {existing.__qualname__} "
                    f"({existing.__module__}); call unregister({source!r}) first to replace it"
                )
            table[source] = fn
        if requires:
            _REQUIRES[_key(fn)] = tuple(requires)
        return fn

    return decorator


def unregister(data_source: str) -> None:
    for grader in GRADERS:
        _REGISTRY[grader].pop(data_source, None)
        _PREFIXES[grader].pop(data_source, None)


def _lookup(data_source: str, grader: Grader) -> RewardFn | None:
    fn = _REGISTRY[grader].get(data_source)
    if fn is not None:
        return fn
    for start, candidate in _PREFIXES[grader].items():
        if data_source.startswith(start):
            return candidate
    return None


def get_reward_fn(data_source: str, grader: Grader = "verl") -> RewardFn:
    fn = (_lookup(data_source, "lenient") if grader == "lenient" else None) or _lookup(data_source, "verl")
    if fn is None:
        raise UnknownDataSourceError(
            f"no reward function for data_source {data_source!r}; known: {registered_sources()}. "
            "Register one with grpo_trainer.rewards.register or set reward.custom_fn='pkg.module:function'"
        )
    missing = [module for module in _REQUIRES.get(_key(fn), ()) if not _installed(module)]
    if missing:
        switch = _lookup(data_source, "lenient") if grader == "verl" else None
        raise GraderUnavailableError(
            f"reward.grader={grader} scores data_source {data_source!r} with {fn.__qualname__}, which "
            f"imports {', '.join(missing)}: not installed here. Install them (grpo-trainer declares them: "
            f"pip install {' '.join(missing)})"
            + (f" or set reward.grader=lenient ({switch.__qualname__})" if switch is not None else "")
        )
    return fn


def registered_sources() -> list[str]:
    return sorted({*_REGISTRY["verl"], *_REGISTRY["lenient"], *(f"{p}*" for p in _PREFIXES["verl"])})
