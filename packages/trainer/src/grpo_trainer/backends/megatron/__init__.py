"""Megatron-Core policy backend through Megatron-Bridge.

Importing this package does not import megatron: `MegatronBackend` is loaded on first use (its
modules subclass megatron-core's), and `provider_config` (grpo_config -> provider settings,
parallel-size and override validation) never imports it. `megatron_available()` answers without it.
"""

from typing import TYPE_CHECKING, Any

from grpo_trainer.backends.megatron.imports import (
    MegatronUnavailableError,
    _unavailable_message,
    megatron_available,
)
from grpo_trainer.backends.megatron.provider_config import (
    ModelShape,
    ParallelLayout,
    ParallelSizeError,
    TransformerEngineRequiredError,
    UnknownOverrideFieldError,
    provider_settings,
    resolve_parallel_layout,
    validate_overrides,
)

if TYPE_CHECKING:
    from grpo_trainer.backends.megatron.backend import MegatronBackend


def __getattr__(name: str) -> Any:
    if name == "MegatronBackend":
        if not megatron_available():  # its modules import megatron-core at load time
            raise MegatronUnavailableError(_unavailable_message())
        from grpo_trainer.backends.megatron.backend import MegatronBackend

        return MegatronBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MegatronBackend",
    "MegatronUnavailableError",
    "ModelShape",
    "ParallelLayout",
    "ParallelSizeError",
    "TransformerEngineRequiredError",
    "UnknownOverrideFieldError",
    "megatron_available",
    "provider_settings",
    "resolve_parallel_layout",
    "validate_overrides",
]
