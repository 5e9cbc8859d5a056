"""Split a nested state dict into a JSON skeleton and a flat {key: tensor} dict, losslessly.

The derivation: docs/INTERNALS.md, `grpo_ckpt.structure`.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["flatten_state", "tensor_keys", "unflatten_state"]

_PRIMITIVES = (str, int, float, bool, type(None))


def flatten_state(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Return (JSON skeleton, {flat key: tensor}) for a nested state dict.

    Raises ValueError naming the path of a value that cannot be stored losslessly.
    """
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(tree, path=(), tensors=tensors)
    return skeleton, tensors


def unflatten_state(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `flatten_state`. Raises ValueError when a referenced tensor is missing."""
    return _decode(skeleton, tensors)


def merge_skeletons(skeletons: list[Any]) -> Any:
    """One skeleton of every rank's: dict entries only some ranks hold are all kept (a model-parallel
    rank's own shards under a key of its own), entries several hold must agree. Raises ValueError at
    the first disagreement."""
    merged = skeletons[0]
    for other in skeletons[1:]:
        merged = _merge(merged, other, path=())
    return merged


def _merge(ours: Any, theirs: Any, *, path: tuple[Any, ...]) -> Any:
    if isinstance(ours, dict) and isinstance(theirs, dict) and "__dict__" in ours and "__dict__" in theirs:
        items = dict((_hashable(k), [k, v]) for k, v in ours["__dict__"])
        for key, value in theirs["__dict__"]:
            known = items.get(_hashable(key))
            items[_hashable(key)] = [key, value if known is None else _merge(known[1], value, path=(*path, key))]
        return {"__dict__": list(items.values())}
    if ours != theirs:
        raise ValueError(f"ranks saved different structures at {_where(path)}: {ours!r} vs {theirs!r}")
    return ours


def _hashable(key: Any) -> tuple[str, Any]:
    return (type(key).__name__, key)  # 0 and "0" stay two keys


def tensor_keys(skeleton: Any) -> list[str]:
    """Flat tensor keys a skeleton references, in encounter order."""
    found: list[str] = []
    _collect_keys(skeleton, found)
    return found


def _flat_key(path: tuple[Any, ...], tensors: dict[str, torch.Tensor]) -> str:
    base = ".".join(str(part) for part in path) or "tensor"
    key, suffix = base, 2
    while key in tensors:  # e.g. keys 0 and "0" at the same level
        key, suffix = f"{base}#{suffix}", suffix + 1
    return key


def _encode(value: Any, *, path: tuple[Any, ...], tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = _flat_key(path, tensors)
        tensors[key] = value
        return {"__tensor__": key}
    if isinstance(value, _PRIMITIVES):
        return _plain(value)
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, _PRIMITIVES):
                raise ValueError(
                    f"state key {key!r} at {_where(path)} has type {type(key).__name__}; "
                    "checkpoint state dicts may only use str/int/float/bool/None keys"
                )
            items.append([_plain(key), _encode(item, path=(*path, key), tensors=tensors)])
        return {"__dict__": items}
    if isinstance(value, tuple):  # torch.Size included
        return {"__tuple__": [_encode(v, path=(*path, i), tensors=tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, path=(*path, i), tensors=tensors) for i, v in enumerate(value)]
    raise ValueError(
        f"cannot checkpoint a {type(value).__module__}.{type(value).__qualname__} at {_where(path)}: "
        "state dicts may hold tensors, dicts, lists, tuples, str/int/float/bool/None and torch.dtype; "
        "convert it (e.g. numpy array -> torch.from_numpy) before saving"
    )


def _plain(value: Any) -> Any:
    # Subclasses (IntEnum, numpy.float64) would serialize but come back as the base type: store the base.
    if value is None or isinstance(value, bool):
        return value
    for base in (int, float, str):
        if isinstance(value, base):
            return base(value)
    raise AssertionError(f"not a primitive: {value!r}")


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        key = node["__tensor__"]
        if key not in tensors:
            raise ValueError(f"checkpoint structure references tensor {key!r}, which the tensor files lack")
        return tensors[key]
    if "__dict__" in node:
        return {key: _decode(item, tensors) for key, item in node["__dict__"]}
    if "__tuple__" in node:
        return tuple(_decode(v, tensors) for v in node["__tuple__"])
    if "__dtype__" in node:
        dtype = getattr(torch, str(node["__dtype__"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {node['__dtype__']!r} in checkpoint structure")
        return dtype
    raise ValueError(f"unknown node in checkpoint structure: {sorted(node)}")


def _collect_keys(node: Any, found: list[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_keys(item, found)
    elif isinstance(node, dict):
        if "__tensor__" in node:
            found.append(node["__tensor__"])
        elif "__dict__" in node:
            for _, item in node["__dict__"]:
                _collect_keys(item, found)
        elif "__tuple__" in node:
            _collect_keys(node["__tuple__"], found)


def _where(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path) or "<root>"
