"""Parsing PYTORCH_*_ALLOC_CONF strings and the Ascend expandable-segments conflict rule."""

from __future__ import annotations

import pytest

from grpo_device import npu_alloc_conf_conflicts, parse_alloc_conf


def test_parse_alloc_conf_strips_and_later_entries_win() -> None:
    conf = " expandable_segments:True , max_split_size_mb:128,,expandable_segments:False, odd"
    assert parse_alloc_conf(conf) == {"expandable_segments": "False", "max_split_size_mb": "128", "odd": ""}


@pytest.mark.parametrize(
    ("conf", "conflicts"),
    [
        ("expandable_segments:True", ()),
        ("expandable_segments:True,garbage_collection_threshold:0.8", ("garbage_collection_threshold",)),
        ("max_split_size_mb:64,expandable_segments:true", ("max_split_size_mb",)),
        (
            "garbage_collection_threshold:0.6,max_split_size_mb:32,expandable_segments:True",
            ("garbage_collection_threshold", "max_split_size_mb"),
        ),
        ("expandable_segments:False,garbage_collection_threshold:0.8", ()),
        ("garbage_collection_threshold:0.8", ()),
        ("", ()),
    ],
)
def test_npu_conflicts(conf: str, conflicts: tuple[str, ...]) -> None:
    assert npu_alloc_conf_conflicts(conf) == conflicts
