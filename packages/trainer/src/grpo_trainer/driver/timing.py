"""Wall time per phase of a step, logged as `timing/<phase>_s` (verl's `timing_s/*`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseTimer:
    """`with timer("update"): ...` records `timing/update_s`; a phase timed twice (the rounds of
    dynamic sampling) is summed."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing/{phase}_s"
            self.metrics[key] = self.metrics.get(key, 0.0) + time.perf_counter() - started
