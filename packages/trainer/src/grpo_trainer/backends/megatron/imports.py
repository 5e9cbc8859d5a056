"""Importing the Megatron stack lazily: megatron-core, Megatron-Bridge (with or without
transformer_engine: grpo_ckpt's `import_megatron_bridge` handles the one unguarded TE import of
Megatron-Bridge 0.6) and, on Ascend NPUs, MindSpeed.

The derivation: docs/INTERNALS.md, `grpo_trainer.backends.megatron.imports`.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import structlog

import grpo_device
from grpo_device import DeviceKind

log = structlog.get_logger()

MINDSPEED_ADAPTOR = "mindspeed.megatron_adaptor"
MINDSPEED_INSTALL = (
    "install MindSpeed (Ascend's adaptor for Megatron-LM / megatron-core) in the release that matches "
    "your Megatron-LM / megatron-core version, from source (https://gitee.com/ascend/MindSpeed: "
    "clone it, check out the branch for your Megatron version, `pip install --no-deps -e MindSpeed`; "
    "PyPI's `mindspeed` is an unrelated placeholder; docs/INSTALL.md lists the pairs). The seed NPU recipes use MindSpeed 0.16 with Megatron-LM 0.16 "
    "(Megatron-Bridge de93536e), as verl's NPU recipe. Or set actor.backend=torch"
)


class MegatronUnavailableError(ImportError):
    """megatron-core / Megatron-Bridge cannot be imported here."""


class MindSpeedUnavailableError(MegatronUnavailableError):
    """The device is an Ascend NPU and MindSpeed's Megatron adaptor cannot be imported."""


class MegatronImportOrderError(RuntimeError):
    """On NPU, megatron modules were imported before MindSpeed's adaptor could patch them."""


def megatron_available() -> bool:
    """True when megatron-core and Megatron-Bridge are installed (imports at most the `megatron`
    namespace package, never a megatron module with code)."""
    return (
        importlib.util.find_spec("megatron") is not None
        and importlib.util.find_spec("megatron.bridge") is not None
    )


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _megatron_modules_loaded() -> list[str]:
    return sorted(name for name in sys.modules if name.startswith("megatron."))


def _unavailable_message() -> str:
    return (
        "actor.backend=megatron needs megatron-core and Megatron-Bridge; the project's hatch env "
        "installs them (`hatch run install-pinned`), elsewhere `pip install --no-deps "
        "megatron-bridge==0.6.2 megatron-core==0.19.2` plus their import-time deps (see "
        "packages/ckpt/README.md and docs/INSTALL.md)"
    )


def import_mindspeed_adaptor() -> ModuleType:
    """`import mindspeed.megatron_adaptor`, before any megatron module; a clear error when MindSpeed
    is missing or broken, or when megatron was imported first."""
    if MINDSPEED_ADAPTOR in sys.modules:
        return sys.modules[MINDSPEED_ADAPTOR]
    early = _megatron_modules_loaded()
    if early:
        raise MegatronImportOrderError(
            f"on npu MindSpeed's adaptor must be imported before megatron, but {', '.join(early[:5])}"
            f"{' ...' if len(early) > 5 else ''} were already imported; call "
            "grpo_trainer.backends.megatron.imports.import_megatron_stack(kind) before any `from megatron ...`"
        )
    try:
        import mindspeed.megatron_adaptor  # noqa: F401  (patches megatron-core for Ascend on import)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == "megatron" or missing.startswith("megatron."):
            raise MegatronUnavailableError(f"{_unavailable_message()} (MindSpeed's adaptor: {exc!r})") from exc
        if missing == "mindspeed" or missing == MINDSPEED_ADAPTOR:
            raise MindSpeedUnavailableError(
                f"actor.backend=megatron on npu needs MindSpeed, and `import {MINDSPEED_ADAPTOR}` failed "
                f"({exc!r}): {MINDSPEED_INSTALL}"
            ) from exc
        raise MindSpeedUnavailableError(
            f"MindSpeed is installed but `import {MINDSPEED_ADAPTOR}` failed ({exc!r}): a dependency of "
            f"it is missing; {MINDSPEED_INSTALL}"
        ) from exc
    except Exception as exc:  # version mismatches surface as ImportError/AttributeError/... in its patches
        raise MindSpeedUnavailableError(
            f"`import {MINDSPEED_ADAPTOR}` failed ({exc!r}); this is usually a MindSpeed release that "
            f"does not match the installed megatron-core; {MINDSPEED_INSTALL}"
        ) from exc
    log.info("megatron.mindspeed_adaptor_imported", module=MINDSPEED_ADAPTOR)
    return sys.modules[MINDSPEED_ADAPTOR]


def import_megatron_stack(kind: DeviceKind | str | None) -> DeviceKind:
    """Call first, before anything imports megatron; safe to call again. On npu imports MindSpeed's
    adaptor (see the module docstring); then checks that megatron-core and Megatron-Bridge are
    installed. Returns the device kind (None: detected)."""
    device = grpo_device.detect() if kind is None else grpo_device.parse_device_kind(kind)
    if device is DeviceKind.NPU:
        import_mindspeed_adaptor()
    if not megatron_available():
        raise MegatronUnavailableError(_unavailable_message())
    return device


def import_auto_bridge() -> Any:
    """Return `megatron.bridge.AutoBridge`."""
    if not megatron_available():
        raise MegatronUnavailableError(_unavailable_message())
    from grpo_ckpt import import_megatron_bridge

    return import_megatron_bridge().AutoBridge
