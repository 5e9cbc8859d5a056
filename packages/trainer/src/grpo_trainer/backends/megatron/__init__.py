"""Megatron-Core policy backend through Megatron-Bridge.

Importing this package does not import megatron: `MegatronBackend.from_config` does, and
`provider_config` (grpo_config -> provider settings, parallel-size and override validation) never does.
"""

from grpo_trainer.backends.megatron.backend import MegatronBackend
from grpo_trainer.backends.megatron.imports import MegatronUnavailableError, megatron_available
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
