"""dict -> load -> to_dict -> load is stable; YAML text round trips too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from grpo_config import load, to_dict, to_yaml

SOURCE = {
    "experiment_name": "rt",
    "device": {"nnodes": 2, "devices_per_node": 8},
    "parallel": {"tp": 2, "pp": 2, "ep": 4, "vpp": 2},
    "data": {"train_files": ["a.parquet"], "train_batch_size": 32},
    "actor": {
        "backend": "megatron",
        "lr": 3e-6,
        "ppo_mini_batch_size": 8,
        "megatron": {"override_transformer_config": {"x": [1, 2]}},
    },
    "ref": {"use_remove_padding": False, "log_prob_micro_batch_size_per_device": 2},
    "checkpoint": {"strict": False, "max_to_keep": 2},
}


def test_dict_load_to_dict_round_trip() -> None:
    cfg = load(SOURCE)
    data = to_dict(cfg)
    assert data["parallel"] == {
        "tp": 2,
        "pp": 2,
        "ep": 4,
        "etp": 1,
        "cp": 1,
        "vpp": 2,
        "sequence_parallel": False,
    }
    assert data["ref"]["parallel"] == data["parallel"]  # inherited
    assert data["ref"]["log_prob_micro_batch_size_per_device"] == 2
    assert load(data) == cfg
    assert to_dict(load(data)) == data


def test_yaml_text_round_trip(tmp_path: Path) -> None:
    cfg = load(SOURCE)
    path = tmp_path / "cfg.yaml"
    path.write_text(to_yaml(cfg), encoding="utf-8")
    assert load(path) == cfg


def test_loaded_config_is_frozen_and_to_dict_is_a_copy() -> None:
    cfg = load(SOURCE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.actor.lr = 1.0  # type: ignore[misc]
    data = to_dict(cfg)
    data["data"]["train_files"].append("b.parquet")
    assert cfg.data.train_files == ["a.parquet"]
    with pytest.raises(TypeError, match="config dataclass instance"):
        to_dict({"a": 1})
