"""Importing Megatron-Bridge on machines without transformer_engine.

Megatron-Bridge 0.6.x imports `transformer_engine.pytorch` unguarded in one module
(`megatron.bridge.peft.lora_layers`, LoRA only, which we do not use), and `import megatron.bridge`
reaches it. Every other module of the bridge and of megatron-core checks for TE itself. So only that
one module is executed with an `__import__` that hands it a placeholder for TE; `sys.modules` never
holds a fake `transformer_engine`, and megatron-core's own "is TE installed?" checks see the truth.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

import structlog

log = structlog.get_logger()

_LORA_MODULE = "megatron.bridge.peft.lora_layers"


class MegatronUnavailableError(ImportError):
    """megatron-core / Megatron-Bridge cannot be imported here."""


def megatron_available() -> bool:
    """True when megatron-core and Megatron-Bridge are installed (does not import them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("megatron", "megatron.bridge"))


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


class _PlaceholderModule(types.ModuleType):
    """Stands in for a TE module: capitalised attributes are classes nothing is an instance of (for
    isinstance checks and annotations); other attributes are placeholder sub-modules. Calling any of
    them would fail, which only LoRA code paths do."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value: Any = type(name, (), {"__module__": self.__name__})
        else:
            value = _PlaceholderModule(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _placeholder_te() -> types.ModuleType:
    return _PlaceholderModule("transformer_engine")


class _LoaderWithPlaceholderTE(importlib.abc.Loader):
    def __init__(self, source_loader: Any) -> None:
        self._source_loader = source_loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        placeholder = _placeholder_te()
        real_import = builtins.__import__

        def import_with_placeholder(name: str, *args: Any, **kwargs: Any) -> Any:
            if name == "transformer_engine" or name.startswith("transformer_engine."):
                return placeholder
            return real_import(name, *args, **kwargs)

        module_builtins = dict(vars(builtins))
        module_builtins["__import__"] = import_with_placeholder
        module.__dict__["__builtins__"] = module_builtins
        exec(self._source_loader.get_code(module.__name__), module.__dict__)
        log.info("megatron_bridge_lora_imported_without_te", module=module.__name__)


class _LoraLayersFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _LORA_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderWithPlaceholderTE(spec.loader)
        return spec


def _install_lora_finder() -> None:
    if not any(isinstance(finder, _LoraLayersFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LoraLayersFinder())


def import_auto_bridge() -> Any:
    """Return `megatron.bridge.AutoBridge`, importing it with or without transformer_engine."""
    if not megatron_available():
        raise MegatronUnavailableError(
            "actor.backend=megatron needs megatron-core and Megatron-Bridge; run inside the `megatron` "
            "hatch env (`hatch run megatron:...`) or `pip install --no-deps megatron-bridge==0.6.2 "
            "megatron-core==0.19.2` plus their import-time deps (see packages/ckpt/README.md)"
        )
    if not transformer_engine_available():
        _install_lora_finder()
    from megatron.bridge import AutoBridge

    return AutoBridge
