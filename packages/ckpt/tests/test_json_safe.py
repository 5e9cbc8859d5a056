from __future__ import annotations

import dataclasses
import enum
import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from grpo_ckpt import SafeJSONEncoder, json_safe

# The package re-exports the function `json_safe`, which shadows the module of that name.
json_safe_module = importlib.import_module("grpo_ckpt.json_safe")


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


@dataclasses.dataclass
class Point:
    x: int
    label: str
    tags: tuple[str, ...] = ()


class HasToDict:
    def __init__(self, payload: object) -> None:
        self.payload = payload

    def to_dict(self) -> dict[str, object]:
        return {"payload": self.payload}


class BrokenToDict:
    def to_dict(self) -> dict[str, object]:
        raise RuntimeError("boom")


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Opaque:
    pass


def _fresh_unknown_warnings(obj: object) -> tuple[object, list[dict]]:
    json_safe_module._warned_types.clear()
    with capture_logs() as logs:
        out = json_safe(obj)
    return out, [e for e in logs if e["event"] == "json_safe.unknown_type"]


def _assert_plain_json(value: object) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str
            _assert_plain_json(item)
    elif isinstance(value, list):
        for item in value:
            _assert_plain_json(item)
    else:
        assert value is None or type(value) in (bool, int, float, str), type(value)


def test_known_types_convert_faithfully() -> None:
    obj = {
        "dc": Point(x=1, label="a", tags=("t",)),
        "enum": Color.RED,
        "enum_int": Color.BLUE,
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "path": Path("/tmp/x"),
        "set": {3, 1, 2},
        "frozen": frozenset({"b", "a"}),
        "tuple": (1, (2, 3)),
        "np_scalar": np.float32(1.5),
        "np_int": np.int64(7),
        "np_small": np.arange(3),
        "np_large": np.zeros((10, 10), dtype=np.float16),
        "tensor_small": torch.tensor([1.0, 2.0]),
        "bytes": b"\x00\x01",
        "func": _assert_plain_json,
        "cls": Point,
        "to_dict": HasToDict(payload={1: "one"}),
        7: "int key",
        (1, 2): "tuple key",
    }
    out = json_safe(obj)
    assert out["dc"] == {"x": 1, "label": "a", "tags": ["t"]}
    assert out["enum"] == "red" and out["enum_int"] == 2
    assert out["dtype"] == "torch.bfloat16" and out["device"] == "cpu"
    assert out["path"] == "/tmp/x"
    assert out["set"] == [1, 2, 3] and out["frozen"] == ["a", "b"]
    assert out["tuple"] == [1, [2, 3]]
    assert out["np_scalar"] == 1.5 and type(out["np_int"]) is int
    assert out["np_small"] == [0, 1, 2]
    assert out["np_large"] == {"__type__": "numpy.ndarray", "shape": [10, 10], "dtype": "float16"}
    assert out["tensor_small"] == [1.0, 2.0]
    assert out["bytes"] == {"__bytes__": "AAE=", "length": 2}
    assert out["func"] == f"{__name__}._assert_plain_json"
    assert out["cls"] == f"{__name__}.Point"
    assert out["to_dict"] == {"payload": {"1": "one"}}
    assert out["7"] == "int key" and out["[1, 2]"] == "tuple key"
    _assert_plain_json(out)


def test_unknown_types_become_tagged_repr_with_one_warning_per_type() -> None:
    out, warnings = _fresh_unknown_warnings([Opaque(), Opaque(), BrokenRepr(), BrokenToDict()])
    assert out[0]["__type__"] == f"{__name__}.Opaque" and out[0]["__repr__"].startswith("<")
    assert out[2] == {"__repr__": "<repr failed: RuntimeError>", "__type__": f"{__name__}.BrokenRepr"}
    assert out[3]["__type__"] == f"{__name__}.BrokenToDict"
    assert sorted(w["type"] for w in warnings) == sorted(
        f"{__name__}.{name}" for name in ("Opaque", "BrokenRepr", "BrokenToDict")
    )
    assert all(w["log_level"] == "warning" for w in warnings)
    with capture_logs() as again:
        json_safe(Opaque())
    assert again == []  # once per type per process


def test_cycles_and_deep_nesting_terminate() -> None:
    loop: list[object] = [1]
    loop.append(loop)
    selfish: dict[str, object] = {}
    selfish["me"] = selfish
    assert json_safe(loop) == [1, {"__cycle__": "builtins.list"}]
    assert json_safe(selfish) == {"me": {"__cycle__": "builtins.dict"}}
    shared = [1]
    assert json_safe([shared, shared]) == [[1], [1]]  # shared, not cyclic: both copies kept

    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    text = json.dumps(json_safe(deep))
    assert "__truncated__" in text


def test_encoder_handles_what_stock_json_rejects() -> None:
    loop: list[object] = []
    loop.append(loop)
    obj = {(1, 2): Opaque(), "cycle": loop, "dtype": torch.float32}
    with pytest.raises(TypeError):
        json.dumps(obj)
    text = json.dumps(obj, cls=SafeJSONEncoder)
    assert json.loads(text)["dtype"] == "torch.float32"


# ---- property-based: nested junk --------------------------------------------------------------------

JUNK_TYPES = [type(f"Junk{i}", (), {"__slots__": ()}) for i in range(4)]

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from([torch.float32, torch.bfloat16, torch.device("cpu"), Color.RED, Path("a/b")]),
    st.builds(np.float64, st.floats(allow_nan=False)),
    st.builds(lambda n: np.arange(n), st.integers(0, 100)),
    st.builds(Point, x=st.integers(), label=st.text(max_size=4)),
    st.sampled_from(JUNK_TYPES).map(lambda cls: cls()),
    st.builds(BrokenRepr),
    st.builds(BrokenToDict),
    st.sampled_from([len, Point, json.dumps, lambda: 0]),
    st.frozensets(st.integers(-3, 3), max_size=3),
)
hashable_keys = st.one_of(st.text(max_size=4), st.integers(), st.none(), st.tuples(st.integers()))

junk = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(hashable_keys, children, max_size=4),
        st.builds(HasToDict, children),
    ),
    max_leaves=25,
)


def _unknown_types_in(obj: object, seen: set[int]) -> set[type]:
    if id(obj) in seen:
        return set()
    seen.add(id(obj))
    if isinstance(obj, (BrokenRepr, BrokenToDict, *JUNK_TYPES)):
        return {type(obj)}
    children: list[object] = []
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, HasToDict):
        children = [obj.payload]
    found: set[type] = set()
    for child in children:
        found |= _unknown_types_in(child, seen)
    return found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=junk, make_cycle=st.booleans())
def test_nested_junk_never_raises_and_dumps(obj: object, make_cycle: bool) -> None:
    if make_cycle:
        obj = [obj]
        obj.append(obj)
    out, warnings = _fresh_unknown_warnings(obj)
    _assert_plain_json(out)
    text = json.dumps(out)
    assert json.dumps(obj, cls=SafeJSONEncoder) == text
    # A fixed point: converting the output again changes nothing (NaN compares unequal, so via text).
    assert json.dumps(json_safe(out)) == text

    expected = {f"{cls.__module__}.{cls.__qualname__}" for cls in _unknown_types_in(obj, set())}
    reported = [w["type"] for w in warnings]
    assert len(reported) == len(set(reported))  # one warning per unknown type
    assert set(reported) == expected
