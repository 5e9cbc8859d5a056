"""Turn arbitrary Python objects into JSON-compatible data, never raising.

`json.dump(obj, default=lambda o: o.to_dict())` fails the whole save on the first object without a
`to_dict`. Here every object gets *some* JSON form: known types a faithful one, anything else a
tagged repr (`{"__repr__": ..., "__type__": ...}`) plus one structlog warning per unknown type.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import threading
import weakref
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np
import structlog
import torch

log = structlog.get_logger()

__all__ = ["SafeJSONEncoder", "json_safe"]

MAX_DEPTH = 100
MAX_REPR_CHARS = 500
MAX_ARRAY_ELEMENTS = 64
MAX_BYTES_INLINE = 4096

_warned_types: weakref.WeakSet[type] = weakref.WeakSet()
_warned_lock = threading.Lock()


def json_safe(obj: Any) -> Any:
    """Return a JSON-compatible copy of `obj` (dicts with str keys, lists, str, int, float, bool, None).

    Handled: `to_dict()`, dataclasses, enums (their value), torch.dtype/torch.device (str), Path (str),
    set/frozenset (sorted list), tuples (list), numpy scalars (item) and small arrays (list; large ones a
    shape/dtype summary), small tensors likewise, bytes (base64), callables and classes (qualified name),
    cycles (`{"__cycle__": type}`), nesting deeper than `MAX_DEPTH`. Anything else becomes
    `{"__repr__": ..., "__type__": ...}` and logs one warning per type per process. Never raises.
    """
    return _convert(obj, active=set(), depth=0)


class SafeJSONEncoder(json.JSONEncoder):
    """`json.dumps(obj, cls=SafeJSONEncoder)`: everything goes through `json_safe` first.

    Overriding `iterencode` (not only `default`) matters: the stock encoder raises on non-str dict keys
    and on cycles before `default` is ever called.
    """

    def iterencode(self, o: Any, _one_shot: bool = False) -> Any:
        return super().iterencode(json_safe(o), _one_shot)

    def default(self, o: Any) -> Any:
        return json_safe(o)


def qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}"


def _convert(obj: Any, *, active: set[int], depth: int) -> Any:
    try:
        return _convert_unguarded(obj, active=active, depth=depth)
    except Exception as exc:  # json_safe must never raise: a misbehaving object becomes a tagged repr
        return _unknown(obj, reason=f"{type(exc).__name__}: {exc}")


def _convert_unguarded(obj: Any, *, active: set[int], depth: int) -> Any:
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, enum.Enum):
        return _convert(obj.value, active=active, depth=depth + 1)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if depth >= MAX_DEPTH:
        return {"__truncated__": f"nesting deeper than {MAX_DEPTH}", "__type__": qualified_name(type(obj))}
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, np.generic):
        return _convert(obj.item(), active=active, depth=depth + 1)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _bytes(bytes(obj))
    if isinstance(obj, np.ndarray):
        return _array(obj.tolist() if obj.size <= MAX_ARRAY_ELEMENTS else None, obj, active, depth)
    if isinstance(obj, torch.Tensor):
        small = obj.numel() <= MAX_ARRAY_ELEMENTS and not obj.is_meta
        return _array(obj.detach().cpu().tolist() if small else None, obj, active, depth)
    if isinstance(obj, type) or (callable(obj) and not _has_to_dict(obj)):
        return qualified_name(obj)

    if id(obj) in active:
        return {"__cycle__": qualified_name(type(obj))}
    active.add(id(obj))
    try:
        return _convert_container(obj, active=active, depth=depth)
    finally:
        active.discard(id(obj))


def _convert_container(obj: Any, *, active: set[int], depth: int) -> Any:
    if _has_to_dict(obj):
        return _convert(obj.to_dict(), active=active, depth=depth + 1)
    if dataclasses.is_dataclass(obj):
        return {
            f.name: _convert(getattr(obj, f.name, None), active=active, depth=depth + 1)
            for f in dataclasses.fields(obj)
        }
    if isinstance(obj, Mapping):
        return {_key(k): _convert(v, active=active, depth=depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_convert(v, active=active, depth=depth + 1) for v in obj]
    if isinstance(obj, (set, frozenset)):
        items = [_convert(v, active=active, depth=depth + 1) for v in obj]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return _unknown(obj, reason=None)


def _has_to_dict(obj: Any) -> bool:
    return not isinstance(obj, type) and callable(getattr(obj, "to_dict", None))


def _key(key: Any) -> str:
    if isinstance(key, str):
        return str(key)
    safe = _convert(key, active=set(), depth=MAX_DEPTH - 1)
    return safe if isinstance(safe, str) else json.dumps(safe, sort_keys=True)


def _array(values: Any, obj: Any, active: set[int], depth: int) -> Any:
    if values is not None:
        return _convert(values, active=active, depth=depth + 1)
    return {"__type__": qualified_name(type(obj)), "shape": list(obj.shape), "dtype": str(obj.dtype)}


def _bytes(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_BYTES_INLINE:
        return {"__bytes__": None, "length": len(data)}
    return {"__bytes__": base64.b64encode(data).decode("ascii"), "length": len(data)}


def _safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception as exc:
        text = f"<repr failed: {type(exc).__name__}>"
    if not isinstance(text, str):
        text = "<repr returned a non-str>"
    return text if len(text) <= MAX_REPR_CHARS else text[: MAX_REPR_CHARS - 3] + "..."


def _unknown(obj: Any, *, reason: str | None) -> dict[str, str]:
    obj_type = type(obj)
    type_name = qualified_name(obj_type)
    with _warned_lock:
        try:
            first = obj_type not in _warned_types
            _warned_types.add(obj_type)
        except TypeError:  # a metaclass without weakref support: warn every time rather than never
            first = True
    if first:
        log.warning("json_safe.unknown_type", type=type_name, reason=reason, fallback="repr")
    return {"__repr__": _safe_repr(obj), "__type__": type_name}

