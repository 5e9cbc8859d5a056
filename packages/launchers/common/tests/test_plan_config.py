"""Which config.json the memory plan counts: the checkpoint's wins, the shipped architecture config
stands in before a download and says so, and a checkpoint of another architecture is planned as it
is with every difference listed."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_config.schema import ActorConfig, DeviceConfig, TrainerConfig
from grpo_launch.memory_plan import plan_for_launch
from grpo_launch.plan_config import architecture_differences, choose_plan_config

PATTERN = ["linear_attention"] * 3 + ["full_attention"]


def _config(*, layers: int = 4, experts: int = 8, hidden: int = 64) -> dict:
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "num_hidden_layers": layers,
        "layer_types": PATTERN * (layers // 4),
        "hidden_size": hidden,
        "intermediate_size": 128,
        "vocab_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "num_experts": experts,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    }


def _write(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _cfg(model_path: Path) -> TrainerConfig:
    return TrainerConfig(
        actor=ActorConfig(model_path=str(model_path), backend="megatron", use_kl_loss=False),
        device=DeviceConfig(kind="cuda", devices_per_node=1),
    )


def test_the_shipped_config_stands_in_before_a_download_and_says_so(tmp_path: Path) -> None:
    shipped = _write(tmp_path / "shipped", _config())
    missing = tmp_path / "models" / "not-yet"
    chosen = choose_plan_config(missing, shipped)
    assert chosen.directory == shipped and not chosen.differences
    assert chosen.description["path"] == str(shipped / "config.json")
    assert "not your checkpoint" in chosen.description["source"] and str(missing) in chosen.description["source"]
    plan = plan_for_launch(_cfg(missing), device_bytes=None, architecture=shipped)
    assert not isinstance(plan, str) and plan.training["weights"] > 0
    assert plan.to_dict()["model_config"] == chosen.description


def test_without_either_config_nothing_is_planned(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    assert choose_plan_config(missing, None).directory is None
    assert choose_plan_config(missing, tmp_path / "no-shipped").directory is None
    plan = plan_for_launch(_cfg(missing), device_bytes=None, architecture=None)
    assert isinstance(plan, str) and "memory not planned" in plan


def test_the_checkpoint_wins_and_the_same_architecture_raises_nothing(tmp_path: Path) -> None:
    shipped = _write(tmp_path / "shipped", _config())
    checkpoint = _write(tmp_path / "ckpt", {**_config(), "torch_dtype": "bfloat16", "eos_token_id": 3})
    chosen = choose_plan_config(checkpoint, shipped)
    assert chosen.directory == checkpoint and chosen.differences == {}
    assert chosen.description == {"path": str(checkpoint / "config.json"), "source": "your checkpoint (actor.model_path)"}


def test_a_checkpoint_of_another_architecture_is_planned_as_it_is_with_the_differences(tmp_path: Path) -> None:
    shipped = _write(tmp_path / "shipped", _config())
    checkpoint = _write(tmp_path / "ckpt", _config(layers=8, experts=16))
    chosen = choose_plan_config(checkpoint, shipped)
    assert chosen.directory == checkpoint
    assert chosen.differences == {
        "num_hidden_layers": {"yours": 8, "shipped": 4},
        "num_experts": {"yours": 16, "shipped": 8},
        "layer_types": {"yours": f"2 x {PATTERN}", "shipped": PATTERN},  # long lists by their period
    }
    assert chosen.description["differs_from_shipped"] == chosen.differences
    assert chosen.description["shipped_path"] == str(shipped / "config.json")
    own = plan_for_launch(_cfg(checkpoint), device_bytes=None, architecture=shipped)
    alone = plan_for_launch(_cfg(checkpoint), device_bytes=None, architecture=None)
    assert not isinstance(own, str) and not isinstance(alone, str)
    assert own.training == alone.training  # the checkpoint's numbers, not the shipped ones


def test_differences_read_a_vision_language_checkpoint_through_its_text_config() -> None:
    text = _config()
    vl = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text}
    other = {**vl, "text_config": {**text, "hidden_size": 128}}
    assert architecture_differences(other, vl) == {"hidden_size": {"yours": 128, "shipped": 64}}
    assert set(architecture_differences(text, vl)) == {"architectures", "model_type"}


def test_an_unreadable_checkpoint_config_is_reported_by_the_plan_not_raised(tmp_path: Path) -> None:
    shipped = _write(tmp_path / "shipped", _config())
    broken = tmp_path / "ckpt"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    chosen = choose_plan_config(broken, shipped)
    assert chosen.directory == broken and chosen.differences == {}
    plan = plan_for_launch(_cfg(broken), device_bytes=None, architecture=shipped)
    assert isinstance(plan, str) and "could not be counted" in plan and str(broken) in plan
