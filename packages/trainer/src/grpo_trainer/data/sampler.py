"""Deterministic, resumable batches of dataset indices.

Epoch `e` visits the indices in the order of a permutation seeded by `seed + e` (or in order when
`shuffle` is false). The state is `(epoch, position)`, position counting the indices already
handed out in that epoch. Take `state_dict()` after a batch has been used (e.g. when saving a
checkpoint after the step that trained on it): a sampler restored from it yields exactly the
batches that were still to come.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class ResumableSampler:
    """Iterating yields the remaining batches of the current epoch, then moves to the next epoch;
    iterate again for the next epoch (`for epoch ...: for batch in sampler: ...`)."""

    def __init__(self, n: int, *, batch_size: int, seed: int, shuffle: bool, drop_last: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if n < (batch_size if drop_last else 1):
            raise ValueError(
                f"{n} prompts cannot fill one batch of {batch_size}; add data or lower data.train_batch_size"
            )
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0

    def _epoch_end(self) -> int:
        return self.n - self.n % self.batch_size if self.drop_last else self.n

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return np.random.default_rng(self.seed + epoch).permutation(self.n).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order = self.epoch_order(self.epoch)
        end = self._epoch_end()
        while self.position < end:
            batch = order[self.position : min(self.position + self.batch_size, end)]
            self.position += len(batch)
            yield batch
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "n": self.n,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("n", "batch_size", "seed", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state was saved with {key}={state[key]!r} but this run has "
                    f"{key}={getattr(self, key)!r}; resume with the same data and batch settings or start fresh"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self._epoch_end():
            raise ValueError(f"invalid sampler state epoch={epoch} position={position}")
        self.epoch, self.position = epoch, position
