"""EnvProfile: per-device variables, launcher overrides, non-clobbering apply, conflict warning."""

from __future__ import annotations

import dataclasses
import os

import pytest
from structlog.testing import capture_logs

from grpo_device import EnvProfile

NPU_VARS = {
    "CPU_AFFINITY_CONF": "1",
    "OMP_NUM_THREADS": "1",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "HCCL_CONNECT_TIMEOUT": "1800",
    "HCCL_BUFFSIZE": "200",
    "TASK_QUEUE_ENABLE": "1",
    "COMBINED_ENABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
    "VLLM_ASCEND_ENABLE_NZ": "0",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "VLLM_USE_V1": "1",
}


def test_profiles_per_device() -> None:
    assert dict(EnvProfile.for_device("npu").vars) == NPU_VARS
    gpu = EnvProfile.for_device("GPU")
    assert (gpu.name, dict(gpu.vars)) == ("cuda", {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "VLLM_USE_V1": "1"})
    assert dict(EnvProfile.for_device("cpu").vars) == {}
    with pytest.raises(ValueError, match="use one of cpu, cuda, gpu, npu"):
        EnvProfile.for_device("tpu")


def test_profile_is_immutable() -> None:
    profile = EnvProfile.for_device("npu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        profile.vars["HCCL_BUFFSIZE"] = "1"  # type: ignore[index]


def test_with_overrides_returns_a_new_profile() -> None:
    base = EnvProfile.for_device("npu")
    tuned = base.with_overrides(HCCL_BUFFSIZE=300, HCCL_CONNECT_TIMEOUT="5400", VLLM_ASCEND_ENABLE_NZ=None)
    assert (tuned.vars["HCCL_BUFFSIZE"], tuned.vars["HCCL_CONNECT_TIMEOUT"]) == ("300", "5400")
    assert "VLLM_ASCEND_ENABLE_NZ" not in tuned.vars
    assert base.vars["HCCL_BUFFSIZE"] == "200"
    with pytest.raises(ValueError, match="TASK_QUEUE_ENABLE=True"):
        base.with_overrides(TASK_QUEUE_ENABLE=True)


def test_apply_never_overrides_user_values() -> None:
    environ = {"HCCL_CONNECT_TIMEOUT": "3600", "OMP_NUM_THREADS": "1", "HOME": "/root"}
    with capture_logs() as logs:
        applied = EnvProfile.for_device("npu").apply(environ=environ)
    assert environ["HCCL_CONNECT_TIMEOUT"] == "3600"
    assert environ == {**NPU_VARS, "HCCL_CONNECT_TIMEOUT": "3600", "HOME": "/root"}
    assert applied.kept_vars == {"HCCL_CONNECT_TIMEOUT": "3600", "OMP_NUM_THREADS": "1"}
    assert applied.skipped_profile_values == {"HCCL_CONNECT_TIMEOUT": "1800", "OMP_NUM_THREADS": "1"}
    assert set(applied.set_vars) == set(NPU_VARS) - {"HCCL_CONNECT_TIMEOUT", "OMP_NUM_THREADS"}
    assert applied.effective == {**NPU_VARS, "HCCL_CONNECT_TIMEOUT": "3600"}
    [entry] = logs
    assert entry["event"] == "env_profile_applied"
    assert entry["kept_user_values"] == {"HCCL_CONNECT_TIMEOUT": "3600"}  # only values that differ


def test_second_apply_sets_nothing() -> None:
    environ: dict[str, str] = {}
    profile = EnvProfile.for_device("cuda")
    assert profile.apply(environ=environ).set_vars == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "VLLM_USE_V1": "1"}
    again = profile.apply(environ=environ)
    assert (again.set_vars, again.kept_vars) == ({}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "VLLM_USE_V1": "1"})


def test_apply_defaults_to_os_environ(monkeypatch) -> None:
    for name in ("CUDA_DEVICE_MAX_CONNECTIONS", "VLLM_USE_V1"):
        monkeypatch.setenv(name, "placeholder")  # records the original so monkeypatch restores it
        monkeypatch.delenv(name)
    monkeypatch.setenv("VLLM_USE_V1", "0")
    applied = EnvProfile.for_device("gpu").apply()
    assert (os.environ["CUDA_DEVICE_MAX_CONNECTIONS"], os.environ["VLLM_USE_V1"]) == ("1", "0")
    assert applied.kept_vars == {"VLLM_USE_V1": "0"}


def test_conflict_in_the_user_value_is_warned() -> None:
    environ = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"}
    with capture_logs() as logs:
        applied = EnvProfile.for_device("npu").apply(environ=environ)
    [warning] = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["event"] == "npu_alloc_conf_conflict"
    assert warning["conflicting_keys"] == ["max_split_size_mb"]
    assert len(applied.warnings) == 1 and "max_split_size_mb" in applied.warnings[0]


def test_only_the_final_value_is_checked_for_conflicts() -> None:
    # The profile would set expandable_segments:True; the user's gc threshold replaces it entirely.
    environ = {"PYTORCH_NPU_ALLOC_CONF": "garbage_collection_threshold:0.8"}
    profile = EnvProfile.for_device("npu").with_overrides(PYTORCH_NPU_ALLOC_CONF="expandable_segments:True")
    with capture_logs() as logs:
        applied = profile.apply(environ=environ)
    assert applied.warnings == ()
    assert [entry for entry in logs if entry["log_level"] == "warning"] == []


def test_launcher_override_that_conflicts_is_warned() -> None:
    profile = EnvProfile.for_device("npu").with_overrides(
        PYTORCH_NPU_ALLOC_CONF="expandable_segments:True,garbage_collection_threshold:0.8"
    )
    with capture_logs() as logs:
        applied = profile.apply(environ={})
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [
        "npu_alloc_conf_conflict"
    ]
    assert "garbage_collection_threshold" in applied.warnings[0]

