"""Loading a user's reward function named explicitly: `"package.module:function"` (importable on
PYTHONPATH), or a Python file as verl's custom_reward_function gives it: `"path/to/file.py:function"`,
or `"path/to/file.py"` with the function named apart (verl's `name`, default `compute_score`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from grpo_trainer.rewards.registry import RewardFn

DEFAULT_FUNCTION_NAME = "compute_score"  # verl's custom_reward_function.name default


class CustomRewardError(ValueError):
    """reward.custom_fn cannot be loaded."""


def load_custom_fn(spec: str, default_name: str = DEFAULT_FUNCTION_NAME) -> RewardFn:
    """The function `spec` names (the function may be a dotted attribute path). A file is read once
    here, so a mistake in it is found before the first step; nothing is ever discovered implicitly."""
    target_spec, sep, attr_path = spec.rpartition(":")
    if not sep:
        target_spec, attr_path = spec, ""
    if target_spec.strip().endswith(".py"):
        fn = FileRewardFn(str(Path(target_spec.strip()).resolve()), (attr_path or default_name).strip())
        fn.resolve(spec)
        return fn
    if not sep or not target_spec.strip() or not attr_path.strip():
        raise CustomRewardError(
            f"reward.custom_fn={spec!r} must look like 'package.module:function' (the module importable on "
            "PYTHONPATH) or 'path/to/file.py[:function]'; the function takes (solution_str, ground_truth, extra_info)"
        )
    module_name = target_spec.strip()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CustomRewardError(
            f"reward.custom_fn={spec!r}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?"
        ) from exc
    except Exception as exc:  # the module itself fails: a syntax error, an import-time exception
        raise _failed_import(spec, module_name, exc) from exc
    return _attribute(module, attr_path.strip(), spec, module_name)


@dataclass(frozen=True)
class FileRewardFn:
    """A function defined in a Python file that is not a module on PYTHONPATH. Pickled as its path
    and name, so a reward worker process loads the file itself (once per process)."""

    path: str
    name: str

    def resolve(self, spec: str | None = None) -> RewardFn:
        module = _FILE_MODULES.get(self.path)
        if module is None:
            module = _load_file(self.path, spec or f"{self.path}:{self.name}")
        return _attribute(module, self.name, spec or f"{self.path}:{self.name}", self.path)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


_FILE_MODULES: dict[str, ModuleType] = {}


def _load_file(path: str, spec: str) -> ModuleType:
    if not Path(path).is_file():
        raise CustomRewardError(f"reward.custom_fn={spec!r}: no file {path}")
    name = f"grpo_custom_reward_{len(_FILE_MODULES)}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and pickling inside the file look their module up
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _failed_import(spec, path, exc) from exc
    _FILE_MODULES[path] = module
    return module


def _failed_import(spec: str, what: str, exc: Exception) -> CustomRewardError:
    return CustomRewardError(
        f"reward.custom_fn={spec!r}: importing {what!r} failed with {type(exc).__name__}: {exc}; "
        "fix the module (the whole traceback is in the run's log)"
    )


def _attribute(module: ModuleType, attr_path: str, spec: str, where: str) -> RewardFn:
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise CustomRewardError(f"reward.custom_fn={spec!r}: {where!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CustomRewardError(f"reward.custom_fn={spec!r} is a {type(target).__name__}, not a function")
    return target
