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
