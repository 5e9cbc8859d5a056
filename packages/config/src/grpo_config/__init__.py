"""grpo_config: typed, validated configuration for grpo.

`load(yaml_path | mapping, overrides)` -> a frozen `TrainerConfig` with ref inheritance resolved
and cross-field checks passed; `to_dict` / `to_yaml` go back. See the package README.
"""

from grpo_config.errors import ConfigError
from grpo_config.inherit import resolve_ref
from grpo_config.loader import load
from grpo_config.replicas import RolloutReplicas
from grpo_config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    DeviceConfig,
    LoggingConfig,
    MegatronConfig,
    MultiTurnConfig,
    ParallelConfig,
    RefConfig,
    RefMegatronConfig,
    RewardConfig,
    RolloutConfig,
    TimeoutsConfig,
    TrainerConfig,
)
from grpo_config.serialize import to_dict, to_yaml
from grpo_config.validate import inert_settings, validate
from grpo_config.version import __version__

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DeviceConfig",
    "LoggingConfig",
    "MegatronConfig",
    "MultiTurnConfig",
    "ParallelConfig",
    "RefConfig",
    "RefMegatronConfig",
    "RewardConfig",
    "RolloutConfig",
    "RolloutReplicas",
    "TimeoutsConfig",
    "TrainerConfig",
    "__version__",
    "inert_settings",
    "load",
    "resolve_ref",
    "to_dict",
    "to_yaml",
    "validate",
]
