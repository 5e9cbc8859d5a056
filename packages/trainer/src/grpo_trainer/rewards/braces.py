"""The balanced-brace scan every box extractor uses (verl's `last_boxed_only_string` rule)."""

from __future__ import annotations


def closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` that closes the first brace group at or after `start` (depth counted from
    `start`, the first `}` that brings it back to 0), or None when the group never closes."""
    depth = 0
    for end in range(start, len(text)):
        char = text[end]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return end
    return None
