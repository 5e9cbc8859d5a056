"""Parsing of allocator config strings (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF syntax).

The syntax is `key:value,key:value`. On Ascend, expandable_segments:True must not be combined
with a non-default garbage_collection_threshold or max_split_size_mb (CANN's PYTORCH_NPU_ALLOC_CONF
documentation: when either is set, expandable_segments must be False). CUDA has no such rule
(since PyTorch 2.5 its allocator keeps GC and max-split freeing away from expandable segments).
"""

from __future__ import annotations

EXPANDABLE_SEGMENTS = "expandable_segments"
NPU_EXPANDABLE_CONFLICT_KEYS = ("garbage_collection_threshold", "max_split_size_mb")


def parse_alloc_conf(conf: str) -> dict[str, str]:
    """`"a:1, b:True"` -> `{"a": "1", "b": "True"}`; an entry without ':' maps to ''; later wins."""
    parsed: dict[str, str] = {}
    for entry in conf.split(","):
        key, _, value = entry.partition(":")
        if key.strip():
            parsed[key.strip()] = value.strip()
    return parsed


def expandable_segments_in(conf: str) -> bool | None:
    """The expandable_segments value a config string sets, or None when it does not set one."""
    value = parse_alloc_conf(conf).get(EXPANDABLE_SEGMENTS)
    if value is None:
        return None
    return value.lower() == "true"


def npu_expandable_blockers(conf: str) -> tuple[str, ...]:
    """Keys set in an NPU config that forbid turning expandable segments on."""
    parsed = parse_alloc_conf(conf)
    return tuple(key for key in NPU_EXPANDABLE_CONFLICT_KEYS if key in parsed)


def npu_alloc_conf_conflicts(conf: str) -> tuple[str, ...]:
    """Keys of an NPU config that conflict with its own expandable_segments:True (empty if none)."""
    return npu_expandable_blockers(conf) if expandable_segments_in(conf) else ()
