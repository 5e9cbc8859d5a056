"""`resolve_device_kind`: device.kind "auto" detects, anything else is parsed."""

from __future__ import annotations

import sys

import pytest
import torch

from grpo_config.schema import DeviceConfig, TrainerConfig
from grpo_device import DeviceKind, InvalidDeviceError
from grpo_trainer.devices import resolve_device_kind


def _cfg(kind: str) -> TrainerConfig:
    return TrainerConfig(device=DeviceConfig(kind=kind))  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "expected"), [("cuda", DeviceKind.CUDA), ("npu", DeviceKind.NPU), ("cpu", DeviceKind.CPU)])
def test_explicit_kind_is_parsed_without_detection(kind: str, expected: DeviceKind) -> None:
    assert resolve_device_kind(_cfg(kind)) is expected


def test_auto_detects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # no torch_npu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DEVICE", raising=False)
    assert resolve_device_kind(_cfg("auto")) is DeviceKind.CPU
    monkeypatch.setenv("DEVICE", "cpu")
    assert resolve_device_kind(_cfg("auto")) is DeviceKind.CPU


def test_a_bad_kind_names_the_setting() -> None:
    with pytest.raises(InvalidDeviceError, match=r"device\.kind='tpu'"):
        resolve_device_kind(_cfg("tpu"))


def test_the_driver_resolves_auto_once_for_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """`train` hands the workers a config whose kind is the driver's detection, not "auto"."""
    from grpo_trainer.devices import with_device_kind

    monkeypatch.setenv("DEVICE", "cpu")
    resolved = with_device_kind(_cfg("auto"))
    assert resolved.device.kind == "cpu" and resolved.device.nnodes == 1
    calls = []
    monkeypatch.setattr("grpo_device.detect", lambda: calls.append(1) or DeviceKind.CUDA)
    assert resolve_device_kind(resolved) is DeviceKind.CPU and calls == []  # no second detection
    explicit = _cfg("npu")
    assert with_device_kind(explicit) is explicit
