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

log = structlog.get_logger()

__all__ = ["capture_rng", "restore_rng"]


def _device_rng_module() -> tuple[str, Any] | None:
    # Inline rather than via grpo_device: the only need is "which accelerator module has RNG state".
    if torch.cuda.is_available():
        return "cuda", torch.cuda
    npu = getattr(torch, "npu", None)  # present once torch_npu is imported
    if npu is not None and npu.is_available():
        return "npu", npu
    return None


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": _b64(torch.get_rng_state()),
        "device": None,
    }
    device = _device_rng_module()
    if device is not None:
        kind_name, module = device
        state["device"] = {"kind": kind_name, "states": [_b64(s) for s in module.get_rng_state_all()]}
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set every RNG back to `state` (from `capture_rng`). Device states are restored only on the
    same device kind with the same device count; otherwise a warning says they were skipped."""
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
    current = _device_rng_module()
    if current is None or current[0] != saved["kind"]:
        log.warning(
            "ckpt.rng_device_skipped",
            saved_kind=saved["kind"],
            current_kind=None if current is None else current[0],
            reason="device kind differs; device RNG left as is",
        )
        return
    module = current[1]
    states = [_from_b64(s) for s in saved["states"]]
    if len(states) != module.device_count():
        log.warning(
            "ckpt.rng_device_skipped",
            saved_devices=len(states),
            current_devices=module.device_count(),
            reason="device count differs; device RNG left as is",
        )
        return
    module.set_rng_state_all(states)
