"""The one error type of grpo_config."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration the user must fix; the message says what to change.

    `key` is the full dotted key the problem is about, when there is one.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key
