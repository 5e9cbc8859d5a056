from __future__ import annotations

import grpo_config


def test_public_api_is_frozen() -> None:
    assert sorted(grpo_config.__all__) == [
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
    for name in grpo_config.__all__:
        assert hasattr(grpo_config, name), name
