"""The launcher's user-facing error: printed as one message, exit status 2, no traceback."""

from __future__ import annotations


class LaunchError(ValueError):
    """Something the user has to fix before a launch (missing model or data, bad environment value).
    The message says what is wrong and how to fix it."""
