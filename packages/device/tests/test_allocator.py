"""set_expandable_segments / read_expandable_segments.

CUDA paths call the real torch allocator-config functions (they parse settings on CPU-only torch
too); failures are produced by monkeypatching those torch functions to raise. NPU paths use the
FAKE torch_npu from conftest. The real-GPU check is marked `gpu`.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from structlog.testing import capture_logs

from grpo_device import AllocatorSettingsError, read_expandable_segments, set_expandable_segments


def _warnings(logs: list[dict]) -> list[dict]:
    return [entry for entry in logs if entry["log_level"] == "warning"]


def test_cpu_is_a_logged_no_op_even_when_strict() -> None:
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="cpu", strict=True) is False
    assert logs == [
        {
            "event": "expandable_segments_skipped",
            "log_level": "info",
            "device": "cpu",
            "requested": True,
            "reason": "cpu",
        }
    ]


def test_enable_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="must be True or False"):
        set_expandable_segments("True", kind="cuda")  # type: ignore[arg-type]


_HAS_GETTER = hasattr(torch._C, "_accelerator_getAllocatorSettings")


@pytest.mark.skipif(
    not _HAS_GETTER, reason="this torch has no _accelerator_getAllocatorSettings (2.11 lacks it)"
)
def test_cuda_round_trip_with_real_torch(restore_cuda_allocator_settings) -> None:
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="cuda") is True
        assert read_expandable_segments("cuda") is True
        assert set_expandable_segments(False, kind="cuda") is True
        assert read_expandable_segments("cuda") is False
    assert _warnings(logs) == []
    assert [entry["verified"] for entry in logs] == [True, True]


def test_cuda_failure_warns_once_and_returns_false(monkeypatch) -> None:
    def refuse(settings: str) -> None:
        raise RuntimeError(f"allocator refused {settings}")

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuse)
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="cuda") is False
    assert logs == [
        {
            "event": "expandable_segments_failed",
            "log_level": "warning",
            "device": "cuda",
            "requested": True,
            "error": "RuntimeError('allocator refused expandable_segments:True')",
        }
    ]


def test_cuda_failure_raises_when_strict(monkeypatch) -> None:
    cause = RuntimeError("driver too old for virtual memory management")

    def refuse(settings: str) -> None:
        raise cause

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuse)
    with capture_logs() as logs, pytest.raises(AllocatorSettingsError, match="strict=False") as err:
        set_expandable_segments(False, kind="cuda", strict=True)
    assert err.value.__cause__ is cause
    assert "expandable_segments=False on cuda" in str(err.value)
    assert _warnings(logs) == []


def test_cuda_readback_disagreeing_counts_as_failure(monkeypatch, restore_cuda_allocator_settings) -> None:
    """The setter is real; the read-back is made to disagree (CUDA not initialised, getter says no)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(
        torch._C, "_accelerator_getAllocatorSettings", lambda: "expandable_segments:False", raising=False
    )
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="cuda") is False
    [warning] = _warnings(logs)
    assert "reports expandable_segments=False" in warning["error"]


def test_cuda_falls_back_to_the_legacy_setter_quietly(monkeypatch) -> None:
    """Simulates torch < 2.9 (no torch._C accelerator allocator functions): the legacy setter is a
    recording stand-in here, because in this torch it only forwards to the removed function."""
    received: list[str] = []

    def legacy_setter(settings: str) -> None:
        warnings.warn("torch.cuda._set_allocator_settings is deprecated", FutureWarning, stacklevel=2)
        received.append(settings)

    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings")
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", legacy_setter)
    with warnings.catch_warnings(), capture_logs() as logs:
        warnings.simplefilter("error")  # the deprecation warning must not reach the caller
        assert set_expandable_segments(True, kind="cuda") is True
    assert received == ["expandable_segments:True"]
    assert logs[0]["verified"] is False  # nothing to read back on such a torch


def test_readback_is_unknown_off_cuda(fake_npu) -> None:
    assert read_expandable_segments("npu") is None
    assert read_expandable_segments("cpu") is None


def test_npu_success_calls_torch_npu_and_is_unverified(fake_npu) -> None:
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="npu") is True
        assert set_expandable_segments(False, kind="npu") is True
    assert fake_npu.allocator_calls == ["expandable_segments:True", "expandable_segments:False"]
    assert [(entry["event"], entry["verified"]) for entry in logs] == [("expandable_segments_set", False)] * 2


def test_npu_failure_warns_with_device_value_and_exception(fake_npu) -> None:
    fake_npu.set_error = RuntimeError("NPU allocator does not support this setting")
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="npu") is False
    [warning] = logs
    assert warning == {
        "event": "expandable_segments_failed",
        "log_level": "warning",
        "device": "npu",
        "requested": True,
        "error": "RuntimeError('NPU allocator does not support this setting')",
    }
    with pytest.raises(AllocatorSettingsError) as err:
        set_expandable_segments(True, kind="npu", strict=True)
    assert err.value.__cause__ is fake_npu.set_error


def test_old_torch_npu_without_the_api_is_a_failure_not_a_crash(fake_npu) -> None:
    del torch.npu.memory._set_allocator_settings
    with capture_logs() as logs:
        assert set_expandable_segments(False, kind="npu") is False
    [warning] = logs
    assert warning["error"].startswith("AttributeError(")


def test_npu_refuses_expandable_with_gc_threshold(fake_npu, monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "garbage_collection_threshold:0.8")
    with capture_logs() as logs:
        assert set_expandable_segments(True, kind="npu") is False
        assert set_expandable_segments(False, kind="npu") is True  # turning them off is always fine
    [warning] = _warnings(logs)
    assert "garbage_collection_threshold" in warning["error"]
    assert fake_npu.allocator_calls == ["expandable_segments:False"]
    with pytest.raises(AllocatorSettingsError, match="Ascend forbids"):
        set_expandable_segments(True, kind="npu", strict=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_real_cuda_allocator_switches_segment_kind(restore_cuda_allocator_settings) -> None:
    torch.cuda.init()
    mib = 1024 * 1024

    def segments_of(tensor: torch.Tensor) -> list[dict]:
        address = tensor.data_ptr()
        return [
            segment
            for segment in torch.cuda.memory._snapshot()["segments"]
            if segment["address"] <= address < segment["address"] + segment["total_size"]
        ]

    assert set_expandable_segments(True, kind="cuda", strict=True) is True
    assert read_expandable_segments("cuda") is True
    expandable = torch.empty(64 * mib, dtype=torch.uint8, device="cuda")
    assert [segment["is_expandable"] for segment in segments_of(expandable)] == [True]

    assert set_expandable_segments(False, kind="cuda", strict=True) is True
    assert read_expandable_segments("cuda") is False
    torch.cuda.empty_cache()
    plain = torch.empty(64 * mib, dtype=torch.uint8, device="cuda")
    assert [segment["is_expandable"] for segment in segments_of(plain)] == [False]
    del expandable, plain
    torch.cuda.empty_cache()
