"""Capture and restore every RNG a training step touches: python, numpy, torch CPU and the device's.

The state is plain JSON (lists of ints, base64 for torch's byte tensors), one file per rank.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import structlog
import torch

import grpo_device
from grpo_device import DeviceKind

log = structlog.get_logger()

__all__ = ["capture_rng", "restore_rng"]


def _kind(kind: DeviceKind | str | None) -> DeviceKind:
    return grpo_device.detect() if kind is None else grpo_device.parse_device_kind(kind)


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng(*, kind: DeviceKind | str | None = None) -> dict[str, Any]:
    """Every generator's state; the device's generators are those of `kind` (None: detected)."""
    version, internal, gauss_next = random.getstate()
    np_kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "kind": np_kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": _b64(torch.get_rng_state()),
        "device": None,
    }
    device = _kind(kind)
    if device is not DeviceKind.CPU:
        states = grpo_device.device_rng_state(device)
        state["device"] = {"kind": device.value, "states": [_b64(s) for s in states]}
    return state


def restore_rng(state: dict[str, Any], *, kind: DeviceKind | str | None = None) -> None:
    """Set every RNG back to `state` (from `capture_rng`). Device states are restored only on the
    same device kind (`kind`, None: detected) with the same device count; otherwise a warning says
    they were skipped."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(_from_b64(state["torch"]))

    saved = state.get("device")
    if saved is None:
        return
    current = _kind(kind)
    if current is DeviceKind.CPU or current.value != saved["kind"]:
        log.warning(
            "ckpt.rng_device_skipped",
            saved_kind=saved["kind"],
            current_kind=None if current is DeviceKind.CPU else current.value,
            reason="device kind differs; device RNG left as is",
        )
        return
    states = [_from_b64(s) for s in saved["states"]]
    visible = grpo_device.device_count(current)
    if len(states) != visible:
        log.warning(
            "ckpt.rng_device_skipped",
            saved_devices=len(states),
            current_devices=visible,
            reason="device count differs; device RNG left as is",
        )
        return
    grpo_device.set_device_rng_state(states, kind=current)
