"""Environment variables per device, applied without clobbering what the user already set."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from types import MappingProxyType

import structlog

from grpo_device.alloc_conf import npu_alloc_conf_conflicts
from grpo_device.allocator import NPU_ALLOC_CONF_ENV
from grpo_device.kinds import DeviceKind, parse_device_kind

log = structlog.get_logger()

# Both accelerators: Megatron needs one hardware queue per device for its compute/comm overlap
# ordering, and rollout uses the vLLM V1 engine.
_ACCELERATOR_VARS = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "VLLM_USE_V1": "1"}
_NPU_VARS = {
    "CPU_AFFINITY_CONF": "1",  # bind each process's threads to the cores near its NPU
    "OMP_NUM_THREADS": "1",
    NPU_ALLOC_CONF_ENV: "expandable_segments:True",
    "HCCL_CONNECT_TIMEOUT": "1800",  # seconds; big clusters take long to build HCCL links
    "HCCL_BUFFSIZE": "200",  # MB per link: CANN's default made explicit; MoE launchers raise it
    "TASK_QUEUE_ENABLE": "1",  # asynchronous operator dispatch
    "COMBINED_ENABLE": "1",  # fuse discontiguous-tensor copies
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
    "VLLM_ASCEND_ENABLE_NZ": "0",  # keep weights in ND layout so in-place weight sync works
}
_PROFILES: dict[DeviceKind, dict[str, str]] = {
    DeviceKind.CUDA: dict(_ACCELERATOR_VARS),
    DeviceKind.NPU: {**_NPU_VARS, **_ACCELERATOR_VARS},
    DeviceKind.CPU: {},
}


def _env_value(name: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(
            f"{name}={value!r}: environment values must be str, int or float; write booleans as the "
            "program expects them (e.g. '1' or 'false')"
        )
    return str(value)


@dataclass(frozen=True, kw_only=True)
class AppliedEnv:
    """What EnvProfile.apply did: variables it set and user values it kept (with the profile's)."""

    profile: str
    set_vars: Mapping[str, str]
    kept_vars: Mapping[str, str]
    skipped_profile_values: Mapping[str, str]
    warnings: tuple[str, ...] = ()

    @property
    def effective(self) -> dict[str, str]:
        """The value in force for every profile variable (to pass on, e.g. to Ray workers)."""
        return {**self.set_vars, **self.kept_vars}


@dataclass(frozen=True, kw_only=True)
class EnvProfile:
    name: str
    vars: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        checked = {key: _env_value(key, value) for key, value in self.vars.items()}
        object.__setattr__(self, "vars", MappingProxyType(checked))

    @classmethod
    def for_device(cls, kind: DeviceKind | str) -> EnvProfile:
        """The profile for cuda (alias gpu), npu or cpu (empty)."""
        device = parse_device_kind(kind)
        return cls(name=device.value, vars=_PROFILES[device])

    def with_overrides(self, **overrides: str | int | float | None) -> EnvProfile:
        """A copy with launcher deltas; None removes a variable from the profile."""
        merged = dict(self.vars)
        for key, value in overrides.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = _env_value(key, value)
        return EnvProfile(name=self.name, vars=merged)

    def apply(self, *, environ: MutableMapping[str, str] | None = None) -> AppliedEnv:
        """Set the profile's variables that `environ` (default os.environ) lacks; keep the rest."""
        env = os.environ if environ is None else environ
        set_vars: dict[str, str] = {}
        kept: dict[str, str] = {}
        skipped: dict[str, str] = {}
        for key, value in self.vars.items():
            if key in env:
                kept[key] = env[key]
                skipped[key] = value
            else:
                env[key] = value
                set_vars[key] = value
        notes = _check_npu_alloc_conf(env)
        applied = AppliedEnv(
            profile=self.name,
            set_vars=set_vars,
            kept_vars=kept,
            skipped_profile_values=skipped,
            warnings=notes,
        )
        differing = {key: kept[key] for key in kept if kept[key] != skipped[key]}
        log.info("env_profile_applied", profile=self.name, set=set_vars, kept_user_values=differing)
        return applied


def _check_npu_alloc_conf(env: Mapping[str, str]) -> tuple[str, ...]:
    conf = env.get(NPU_ALLOC_CONF_ENV)
    conflicts = npu_alloc_conf_conflicts(conf) if conf else ()
    if not conflicts:
        return ()
    message = (
        f"{NPU_ALLOC_CONF_ENV}={conf!r} combines expandable_segments:True with {', '.join(conflicts)}; "
        "Ascend requires expandable_segments:False when either is set: drop one side"
    )
    log.warning("npu_alloc_conf_conflict", value=conf, conflicting_keys=list(conflicts), fix=message)
    return (message,)
