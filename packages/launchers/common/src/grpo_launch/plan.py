"""Resolve a launch: profile + device delta + environment variables + CLI overrides -> a validated
`TrainerConfig`, the environment to apply, and where the data comes from. Nothing here has side
effects; `steps.py` carries the plan out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpo_config
import grpo_device
from grpo_config.schema import TrainerConfig
from grpo_launch.dataset_rows import RECIPES
from grpo_launch.errors import LaunchError
from grpo_launch.profile import DEVICE_KINDS, LaunchProfile, deep_merge

Preset = Literal["tiny", "tiny-vl", "tiny-tool", "full"]
# Presets that build their own model and task on the CPU.
TINY_PRESETS = ("tiny", "tiny-vl", "tiny-tool")

_CLI_NAMES = {kind: name for name, kind in DEVICE_KINDS.items()}

# Proxies are for reaching the internet (hub downloads during data preparation); Ray's and the
# collective libraries' node-to-node traffic must not go through them, so they are dropped afterwards.
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@dataclass(frozen=True, kw_only=True)
class DataPlan:
    """Where the training data is and, when it is the default location, how to build it if missing."""

    dataset: str
    directory: Path
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    source: str  # a local HF datasets directory or a hub id
    prepare_if_missing: bool  # only for the default files under the data directory, never for yours


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    launcher: str
    model_id: str
    preset: Preset
    device: str  # CLI name: gpu | npu | cpu
    config: TrainerConfig
    env: Mapping[str, str]  # the device's EnvProfile with the launcher's deltas; applied without clobbering
    output_dir: Path
    data: DataPlan | None  # None for the tiny preset (it builds its own task)
    architecture: Path | None = None  # the profile's shipped config.json directory (LaunchProfile)

    @property
    def world_size(self) -> int:
        return self.config.device.world_size


def device_from_cli(choice: str | None, *, environ: Mapping[str, str], dry_run: bool) -> str:
    """The CLI device name: the explicit choice, else `DEVICE`, else `grpo_device.detect()`. A dry run
    takes `DEVICE` at its word (it inspects another machine's launch); a real run also checks that
    the device is usable here."""
    if choice is not None:
        return choice
    if dry_run and environ.get("DEVICE", "").strip():
        kind = grpo_device.parse_device_kind(environ["DEVICE"], source="DEVICE")
    else:
        kind = grpo_device.detect(environ=environ)
    return _CLI_NAMES[kind.value]


def env_profile_vars(device: str, deltas: Mapping[str, str]) -> dict[str, str]:
    kind = grpo_device.DeviceKind(DEVICE_KINDS[device])
    profile = grpo_device.EnvProfile.for_device(kind)
    if deltas:
        profile = profile.with_overrides(**deltas)
    return dict(profile.vars)


def plan_full(
    profile: LaunchProfile,
    *,
    device: str,
    output_dir: Path | None,
    overrides: Sequence[str],
    environ: Mapping[str, str],
) -> LaunchPlan:
    if device not in profile.devices:
        raise LaunchError(
            f"{profile.launcher}: the full {profile.model_name} run needs a device in "
            f"{{{', '.join(profile.supported_devices())}}}, not {device!r}. Pass --device "
            f"{'|'.join(profile.supported_devices())} (with --dry-run to inspect the config on this "
            "machine) or use --preset tiny for a CPU run."
        )
    home = Path(environ.get("HOME") or Path.home())
    data = _data_plan(profile, environ=environ, home=home)
    model_path = environ.get("MODEL_PATH") or str(home / "models" / profile.model_name)
    from_env: dict[str, Any] = {
        "actor": {"model_path": model_path},
        "data": {"train_files": list(data.train_files), "val_files": list(data.val_files)},
        "device": {"kind": DEVICE_KINDS[device]},
    }
    if environ.get("NNODES"):
        from_env["device"]["nnodes"] = _positive_int("NNODES", environ["NNODES"])
    merged = deep_merge(profile.config_for(device), from_env)
    out = _output_dir(output_dir, merged)
    merged = deep_merge(merged, _output_paths(out))
    config = _load(merged, overrides, num_experts=profile.num_experts)
    return LaunchPlan(
        launcher=profile.launcher,
        model_id=profile.model_id,
        preset="full",
        device=device,
        config=config,
        env=env_profile_vars(device, profile.env_for(device)),
        output_dir=out,
        data=data,
        architecture=profile.architecture,
    )


def plan_tiny(
    profile: LaunchProfile,
    *,
    device: str,
    output_dir: Path | None,
    overrides: Sequence[str],
    preset: Preset = "tiny",
) -> LaunchPlan:
    """A tiny preset: `grpo_launch.presets.tiny_preset` (text), `tiny_vl_preset` (vision-language)
    or `tiny_tool_preset` (tool calls) builds a shrunk model and task under the output directory;
    the CLI overrides go over it. The device is the CPU unless chosen explicitly."""
    from grpo_launch import presets  # build models: imported only when asked for

    out = tiny_output_dir(profile, output_dir, preset)
    build = {"tiny-vl": presets.tiny_vl_preset, "tiny-tool": presets.tiny_tool_preset}.get(
        preset, presets.tiny_preset
    )
    base = build(out)
    merged = deep_merge(base, {"device": {"kind": DEVICE_KINDS[device]}})
    config = _load(merged, overrides, num_experts=None)
    return LaunchPlan(
        launcher=profile.launcher,
        model_id=profile.model_id,
        preset=preset,
        device=device,
        config=config,
        env=env_profile_vars(device, {}),
        output_dir=out,
        data=None,
    )


def tiny_output_dir(profile: LaunchProfile, output_dir: Path | None, preset: Preset) -> Path:
    """Where a tiny preset builds its model and task and writes its run."""
    return (
        output_dir or Path("outputs") / f"{profile.launcher.removeprefix('grpo-launch-')}-{preset}"
    ).absolute()


def _load(merged: dict[str, Any], overrides: Sequence[str], *, num_experts: int | None) -> TrainerConfig:
    return grpo_config.load(merged, list(overrides), num_experts=num_experts)


def _data_plan(profile: LaunchProfile, *, environ: Mapping[str, str], home: Path) -> DataPlan:
    recipe = RECIPES[profile.dataset]
    directory = Path(environ.get("DATA_DIR") or home / "data") / profile.dataset
    train = _file_list(environ.get("TRAIN_FILES", ""))
    val = _file_list(environ.get("VAL_FILES", ""))
    return DataPlan(
        dataset=profile.dataset,
        directory=directory,
        train_files=train or (str(directory / "train.parquet"),),
        val_files=val or (str(directory / "test.parquet"),),
        source=environ.get("DATA_SOURCE") or recipe.hub_id,
        prepare_if_missing=not train and not val,
    )


def _file_list(value: str) -> tuple[str, ...]:
    """TRAIN_FILES / VAL_FILES: one path, a comma-separated list, or a verl-style "['a', 'b']"."""
    inner = value.strip().removeprefix("[").removesuffix("]")
    return tuple(p.strip().strip("'\"") for p in inner.split(",") if p.strip().strip("'\""))


def _positive_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise LaunchError(f"{name} must be a positive integer (the number of nodes), got {value!r}")
    return number


def _output_dir(output_dir: Path | None, merged: Mapping[str, Any]) -> Path:
    return (output_dir or Path("outputs") / str(merged.get("experiment_name", "grpo"))).absolute()


def _output_paths(out: Path) -> dict[str, Any]:
    return {"checkpoint": {"dir": str(out / "checkpoints")}, "logging": {"dir": str(out / "logs")}}


def env_kept(env: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """Names the user already exported with a different value: theirs is kept."""
    return sorted(name for name, value in env.items() if name in environ and environ[name] != value)
