"""Loading a user's reward function from an explicit `"package.module:function"` string."""

from __future__ import annotations

import importlib

from grpo_trainer.rewards.registry import RewardFn


class CustomRewardError(ValueError):
    """reward.custom_fn cannot be loaded."""


def load_custom_fn(spec: str) -> RewardFn:
    """Import `function` from `package.module` as given in `spec` ("package.module:function";
    the function may be a dotted attribute path). Nothing is ever discovered implicitly."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name.strip() or not attr_path.strip():
        raise CustomRewardError(
            f"reward.custom_fn={spec!r} must look like 'package.module:function' "
            "(the module importable on PYTHONPATH, the function taking (solution_str, ground_truth, extra_info))"
        )
    try:
        target = importlib.import_module(module_name.strip())
    except ImportError as exc:
        raise CustomRewardError(
            f"reward.custom_fn={spec!r}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?"
        ) from exc
    except Exception as exc:  # the module itself fails: a syntax error, an import-time exception
        raise CustomRewardError(
            f"reward.custom_fn={spec!r}: importing {module_name!r} failed with {type(exc).__name__}: {exc}; "
            "fix the module (the whole traceback is in the run's log)"
        ) from exc
    for part in attr_path.strip().split("."):
        if not hasattr(target, part):
            raise CustomRewardError(
                f"reward.custom_fn={spec!r}: {module_name!r} has no attribute {attr_path!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise CustomRewardError(f"reward.custom_fn={spec!r} is a {type(target).__name__}, not a function")
    return target
