"""What the GPU benches share: one results dict, written to its JSON file after each phase; log lines
timed from the start; phases whose failure is recorded under their key and does not stop the next."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Record(dict):
    def __init__(self) -> None:
        super().__init__(status="started")
        self.t0 = time.time()
        self.path: Path | None = None  # set once the output folder is known

    def log(self, *parts: Any) -> None:
        print(f"[{time.time() - self.t0:7.1f}s]", *parts, flush=True)

    def dump(self) -> None:
        self["elapsed_s"] = round(time.time() - self.t0, 1)
        if self.path is not None:
            self.path.write_text(json.dumps(self, indent=1, default=str))

    def phase(self, key: str, run: Callable[[], Any]) -> Any:
        """One phase: its result (or its error) under `key`; the next phases run either way."""
        try:
            self[key] = run()
        except Exception as error:
            self[key] = f"FAILED {type(error).__name__}: {str(error)[:1000]}"
            traceback.print_exc()
        self.log(key, json.dumps(self[key], default=str))
        self.dump()
        return self[key]


def sync() -> None:
    """Wait for the GPU's queued work before a timer reads the clock (nothing to wait for on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
