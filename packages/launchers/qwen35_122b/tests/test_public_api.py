"""The public surface of grpo_launch_qwen35_122b is deliberate: changing it means changing this list."""

from __future__ import annotations

import grpo_launch_qwen35_122b


def test_all_is_frozen() -> None:
    assert sorted(grpo_launch_qwen35_122b.__all__) == ["PROFILE", "__version__", "main"]
