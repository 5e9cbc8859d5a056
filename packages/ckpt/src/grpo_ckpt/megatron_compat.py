"""Import Megatron-Bridge on machines without Transformer Engine.

megatron-bridge 0.6.2's `megatron.bridge.peft.lora_layers` does `import transformer_engine.pytorch
as te` unguarded (every other TE import in bridge and core is guarded), so `import megatron.bridge`
fails without TE. We do not fake TE for everyone: a stub is put in `sys.modules` only while that one
module executes, then removed, so all other code still sees "no TE" and takes its non-TE paths.
The stub's attributes are placeholder classes: `isinstance(x, te.Linear)` is False, and calling one
raises ImportError (only TE-fused LoRA would, which needs TE anyway).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["import_megatron_bridge"]

_LORA_LAYERS = "megatron.bridge.peft.lora_layers"
_TE_NAMES = ("transformer_engine", "transformer_engine.pytorch")


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _PlaceholderMeta(name, (), {"__module__": "transformer_engine (absent)"})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"transformer_engine is not installed: {cls.__name__} is unavailable")


def _stub_modules() -> dict[str, types.ModuleType]:
    stubs = {}
    for name in _TE_NAMES:
        module = types.ModuleType(name, "placeholder: transformer_engine is not installed")
        module.__getattr__ = lambda attr: _PlaceholderMeta(attr, (), {"__module__": "transformer_engine (absent)"})  # type: ignore[method-assign]
        stubs[name] = module
    stubs["transformer_engine"].pytorch = stubs["transformer_engine.pytorch"]  # type: ignore[attr-defined]
    return stubs


class _StubTEWhileExecuting(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stubs = _stub_modules()
        sys.modules.update(stubs)
        try:
            self.inner.exec_module(module)
        finally:
            for name in stubs:
                sys.modules.pop(name, None)


class _LoraLayersFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _LORA_LAYERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _StubTEWhileExecuting(spec.loader)
        return spec


def import_megatron_bridge() -> types.ModuleType:
    """`import megatron.bridge`, working around the unguarded TE import when TE is absent.

    Raises ImportError (from Python) when megatron-bridge itself is not installed: use the `megatron`
    hatch env (`hatch -e megatron run ...`).
    """
    if "megatron.bridge" in sys.modules or importlib.util.find_spec("transformer_engine") is not None:
        return importlib.import_module("megatron.bridge")
    finder = _LoraLayersFinder()
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("megatron.bridge")
    finally:
        sys.meta_path.remove(finder)
