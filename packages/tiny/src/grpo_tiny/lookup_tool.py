"""The tiny-tool task's one tool (`rollout.multi_turn.function_tool_path` points at this file: each
public function in it is a tool)."""

# Each key's secret digit: a fixed shuffle, so no prompt tells it and only the tool knows it.
SECRETS = dict(zip("abcd", "7394", strict=True))


def lookup(key: str) -> str:
    """The secret digit of a key.

    Args:
        key: one letter, a to d.
    """
    return SECRETS.get(key.strip(), "no such key")
