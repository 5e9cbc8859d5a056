"""Errors raised by grpo_ckpt. All are ValueError subclasses: each message says what to do."""

from __future__ import annotations

__all__ = ["CheckpointCorruptError", "CheckpointNotFoundError", "CheckpointSpaceError", "StrictExportError"]


class CheckpointCorruptError(ValueError):
    """A checkpoint file is missing, truncated or has a different sha256 than its manifest records."""


class CheckpointNotFoundError(ValueError):
    """An explicit resume path does not hold a complete checkpoint."""


class CheckpointSpaceError(ValueError):
    """The disk holding the checkpoints has less free space than the last checkpoint took: the save
    was refused before it wrote anything."""


class StrictExportError(ValueError):
    """A strict HF export found keys that were not written or were not expected."""

    def __init__(self, message: str, *, missing: list[str], unexpected: list[str]) -> None:
        super().__init__(message)
        self.missing = missing
        self.unexpected = unexpected
