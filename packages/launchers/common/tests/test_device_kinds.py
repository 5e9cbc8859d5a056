"""CLI device names map onto grpo_device's kinds; the machinery spells no device kind itself."""

from __future__ import annotations

from pathlib import Path

from grpo_device import DeviceKind
from grpo_launch.profile import DEVICE_KINDS

SRC = Path(__file__).resolve().parents[1] / "src" / "grpo_launch"


def test_cli_names_map_onto_device_kinds() -> None:
    assert dict(DEVICE_KINDS) == {"gpu": DeviceKind.CUDA, "npu": DeviceKind.NPU, "cpu": DeviceKind.CPU}
    assert {DeviceKind(kind) for kind in DEVICE_KINDS.values()} == set(DeviceKind)


def test_no_cuda_string_literal_in_the_sources() -> None:
    offenders = [p.name for p in SRC.rglob("*.py") if '"cuda"' in p.read_text() or "'cuda'" in p.read_text()]
    assert not offenders
