"""Device detection and the DEVICE override. NPU cases use the FAKE torch_npu from conftest."""

from __future__ import annotations

import sys

import pytest
import torch
from structlog.testing import capture_logs

from grpo_device import DeviceKind, DeviceUnavailableError, InvalidDeviceError, detect, parse_device_kind


def test_bad_device_value_lists_the_valid_ones(no_npu, monkeypatch) -> None:
    monkeypatch.setenv("DEVICE", "tpu")
    with pytest.raises(
        ValueError, match=r"DEVICE='tpu' is not a valid device; use one of cpu, cuda, gpu, npu"
    ) as err:
        detect()
    assert isinstance(err.value, InvalidDeviceError)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [("gpu", DeviceKind.CUDA), (" CUDA ", DeviceKind.CUDA), ("Npu", DeviceKind.NPU), ("CPU", DeviceKind.CPU)],
)
def test_parse_device_kind_accepts_aliases_in_any_case(raw: str, kind: DeviceKind) -> None:
    assert parse_device_kind(raw) is kind


def test_device_override_is_case_insensitive(no_npu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # no GPU on CI machines
    monkeypatch.setenv("DEVICE", "  GPU ")
    assert detect() is DeviceKind.CUDA


def test_device_cpu_wins_over_a_visible_npu(fake_npu, monkeypatch) -> None:
    monkeypatch.setenv("DEVICE", "cpu")
    assert detect() is DeviceKind.CPU


def test_device_npu_without_torch_npu_is_a_clear_error(no_npu, monkeypatch) -> None:
    monkeypatch.setenv("DEVICE", "npu")
    with pytest.raises(DeviceUnavailableError, match="DEVICE=npu but no NPU is usable"):
        detect()


def test_device_gpu_without_cuda_is_a_clear_error(no_npu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("DEVICE", "gpu")
    with pytest.raises(DeviceUnavailableError, match=r"torch.cuda.is_available\(\) is False"):
        detect()


def test_visible_npu_is_detected_before_cuda(fake_npu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert detect() is DeviceKind.NPU


def test_importable_torch_npu_without_a_device_is_not_npu(fake_npu, monkeypatch) -> None:
    fake_npu.available = False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert detect() is DeviceKind.CUDA


def test_nothing_available_is_cpu(no_npu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect() is DeviceKind.CPU


def test_empty_device_value_means_detect(no_npu, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("DEVICE", "  ")
    assert detect() is DeviceKind.CPU


def test_explicit_environ_mapping_is_used_instead_of_os_environ(fake_npu, monkeypatch) -> None:
    monkeypatch.setenv("DEVICE", "npu")
    assert detect(environ={"DEVICE": "cpu"}) is DeviceKind.CPU


def test_broken_torch_npu_install_is_logged_and_skipped(clean_env, tmp_path) -> None:
    """A real module file standing in for a torch_npu whose CANN libraries are missing."""
    (tmp_path / "torch_npu.py").write_text(
        "raise ImportError('libascendcl.so: cannot open shared object file')\n"
    )
    clean_env.delitem(sys.modules, "torch_npu", raising=False)
    clean_env.syspath_prepend(str(tmp_path))
    clean_env.setattr(torch.cuda, "is_available", lambda: False)
    with capture_logs() as logs:
        assert detect() is DeviceKind.CPU
    failures = [entry for entry in logs if entry["event"] == "torch_npu_import_failed"]
    assert failures and "libascendcl.so" in failures[0]["error"]
    assert failures[0]["log_level"] == "warning"
