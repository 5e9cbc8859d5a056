"""Scoring a batch of responses. A reward that raises, returns something that is not a number,
or is not done within `timeout_s` of the batch's start (one budget for the whole batch, shared by
`num_workers` workers: hung rows cost one timeout per batch, not one each) scores 0, is counted and
logged; the run goes on. An item whose
data_source has no reward function scores 0 and is counted too (one warning per source).

With `custom_fn` set, that function scores every item whatever its data_source (as verl's
custom_reward_function). `score` is not meant to be called from several threads at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from grpo_trainer.rewards.custom import DEFAULT_FUNCTION_NAME, load_custom_fn
from grpo_trainer.rewards.isolation import FunctionLoadError, Outcome, ProcessRunner, ThreadRunner
from grpo_trainer.rewards.protocol import describe_error
from grpo_trainer.rewards.registry import Grader, RewardFn, UnknownDataSourceError, get_reward_fn

log = structlog.get_logger()

MAX_LOGGED_FAILURES = 3


@dataclass(frozen=True, kw_only=True)
class RewardItem:
    solution_str: str
    ground_truth: Any
    data_source: str
    extra_info: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class RewardResult:
    scores: list[float]
    n_errors: int = 0
    n_timeouts: int = 0
    n_unknown_source: int = 0
    first_failure: str | None = None  # what the first failed item's reward said (or why it had none)

    @property
    def all_failed(self) -> bool:
        """Every item failed (raised, timed out or had no reward function): the scores say nothing."""
        failed = self.n_errors + self.n_timeouts + self.n_unknown_source
        return bool(self.scores) and failed == len(self.scores)


def _as_item(item: RewardItem | Mapping[str, Any]) -> RewardItem:
    if isinstance(item, RewardItem):
        return item
    if isinstance(item, Mapping):
        return RewardItem(
            solution_str=item["solution_str"],
            ground_truth=item["ground_truth"],
            data_source=item["data_source"],
            extra_info=item.get("extra_info"),
        )
    raise TypeError(f"reward items must be RewardItem or mappings, got {type(item).__name__}")


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class AllRewardsFailedError(ValueError):
    """Every reward call of a step failed: the run would train on zeros. The message gives the
    first failure and the setting to fix."""


class RewardManager:
    """`isolation="process"` runs rewards in worker processes (a hung one is killed);
    functions that cannot be pickled by reference fall back to daemon threads. `grader` picks the
    built-in rewards' grading (`registry`: "verl" or "lenient")."""

    def __init__(
        self,
        timeout_s: float,
        custom_fn: RewardFn | str | None = None,
        *,
        custom_fn_name: str = DEFAULT_FUNCTION_NAME,
        num_workers: int = 1,
        isolation: Literal["process", "thread"] = "process",
        grader: Grader = "verl",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"reward timeout_s must be > 0, got {timeout_s}")
        if isolation not in ("process", "thread"):
            raise ValueError(f"isolation must be 'process' or 'thread', got {isolation!r}")
        self.timeout_s = float(timeout_s)
        self.grader = grader
        self._custom = load_custom_fn(custom_fn, custom_fn_name) if isinstance(custom_fn, str) else custom_fn
        self._threads = ThreadRunner(num_workers=num_workers)
        self._processes = ProcessRunner(num_workers=num_workers) if isolation == "process" else None
        self._process_keys: dict[int, int | None] = {}
        self._functions: dict[int, RewardFn] = {}
        self._warned_sources: set[str] = set()

    def _resolve(self, data_source: str) -> RewardFn | None:
        if self._custom is not None:
            return self._custom
        try:
            return get_reward_fn(data_source, self.grader)
        except UnknownDataSourceError as exc:
            if data_source not in self._warned_sources:
                self._warned_sources.add(data_source)
                log.warning("reward data_source unknown, scoring 0", data_source=data_source, hint=str(exc))
            return None

    def _process_key(self, fn: RewardFn) -> int | None:
        """Worker-process key for `fn`, or None to run it in a thread."""
        if self._processes is None:
            return None
        if id(fn) not in self._process_keys:
            self._functions[id(fn)] = fn
            try:
                self._process_keys[id(fn)] = self._processes.preload(fn)
            except Exception as exc:  # pickling raises several types; FunctionLoadError too
                log.warning(
                    "reward function runs in a thread, not a worker process",
                    function=_name(fn),
                    reason=describe_error(exc),
                )
                self._process_keys[id(fn)] = None
        return self._process_keys[id(fn)]

    def score(self, items: Sequence[RewardItem | Mapping[str, Any]]) -> RewardResult:
        rewards = [_as_item(item) for item in items]
        scores = [0.0] * len(rewards)
        n_unknown = 0
        in_process: list[tuple[int, tuple[int, tuple[Any, ...]]]] = []
        in_thread: list[tuple[int, tuple[RewardFn, tuple[Any, ...]]]] = []
        for i, item in enumerate(rewards):
            fn = self._resolve(item.data_source)
            if fn is None:
                n_unknown += 1
                continue
            args = (item.solution_str, item.ground_truth, item.extra_info)
            key = self._process_key(fn)
            if key is None:
                in_thread.append((i, (fn, args)))
            else:
                in_process.append((i, (key, args)))

        outcomes: list[tuple[int, Outcome]] = []
        if in_process:
            assert self._processes is not None
            try:
                done = self._processes.run([call for _, call in in_process], self.timeout_s)
                outcomes += zip([i for i, _ in in_process], done, strict=True)
            except FunctionLoadError as exc:
                log.warning("reward worker processes failed; scoring this batch in threads", reason=str(exc))
                in_thread += [(i, (self._functions[key], args)) for i, (key, args) in in_process]
        if in_thread:
            done = self._threads.run([call for _, call in in_thread], self.timeout_s)
            outcomes += zip([i for i, _ in in_thread], done, strict=True)

        failures = {"error": [], "timeout": []}
        for i, outcome in outcomes:
            if outcome.status == "ok":
                scores[i] = outcome.score
            else:
                failures[outcome.status].append((i, outcome.message))
        for status, failed in failures.items():
            if failed:
                log.warning(
                    f"reward {status}s scored 0",
                    count=len(failed),
                    **({"hint": "raise reward.timeout_s (the batch's budget) or reward.num_workers"}
                       if status == "timeout" else {}),
                    examples=[
                        {"item": i, "data_source": rewards[i].data_source, "message": message}
                        for i, message in failed[:MAX_LOGGED_FAILURES]
                    ],
                )
        failed = sorted([*failures["error"], *failures["timeout"]])
        first = failed[0][1] if failed else None
        if first is None and n_unknown:
            source = next(item.data_source for item in rewards if self._resolve(item.data_source) is None)
            first = f"no reward function for data_source {source!r}"
        return RewardResult(
            scores=scores,
            n_errors=len(failures["error"]),
            n_timeouts=len(failures["timeout"]),
            n_unknown_source=n_unknown,
            first_failure=first,
        )

    def close(self) -> None:
        if self._processes is not None:
            self._processes.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
