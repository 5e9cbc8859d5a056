"""What a reward call returns and how it crosses the pipe to a worker process (length-prefixed
pickles). Shared by the parent (`isolation`) and the worker (`_worker`); no heavy imports."""

from __future__ import annotations

import math
import os
import pickle
import struct
from collections.abc import Mapping
from typing import Any, BinaryIO

_HEADER = struct.Struct("<Q")


def as_score(value: Any) -> float:
    """A reward function's return value as a finite float (a mapping's "score" is used)."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise TypeError(f"reward returned a mapping without 'score': keys {sorted(map(str, value))}")
        value = value["score"]
    if isinstance(value, bool | int | float) or hasattr(value, "__float__"):
        score = float(value)
        if not math.isfinite(score):
            raise ValueError(f"reward returned a non-finite score {score}")
        return score
    raise TypeError(f"reward returned {type(value).__name__}, expected a number")


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def write_message(fd: int | BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    payload = _HEADER.pack(len(data)) + data
    if isinstance(fd, int):
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
    else:
        fd.write(payload)
        fd.flush()


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> Any:
    """The next message, or raises EOFError when the other side has gone."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        raise EOFError("pipe closed")
    body = _read_exact(fd, _HEADER.unpack(header)[0])
    if body is None:
        raise EOFError("pipe closed mid-message")
    return pickle.loads(body)
