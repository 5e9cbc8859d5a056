"""Unknown keys, wrong types and bad sources give one clean paragraph naming the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_config import ConfigError, load


def _message(source: object = None, overrides: tuple[str, ...] = ()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(source, overrides)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert "\n" not in str(info.value), "errors are one paragraph"
    return info.value


def test_unknown_key_names_full_dotted_key_and_nearest_sibling() -> None:
    err = _message(None, ("actor.ppo_micro_batch_size_per_gpu=2",))
    assert str(err) == (
        "Unknown config key 'actor.ppo_micro_batch_size_per_gpu'. "
        "Did you mean 'actor.ppo_micro_batch_size_per_device'?"
    )
    assert err.key == "actor.ppo_micro_batch_size_per_gpu"


def test_unknown_key_deep_in_yaml_mapping() -> None:
    err = _message({"actor": {"megatron": {"moe_grouped_gem": False}}})
    assert "'actor.megatron.moe_grouped_gem'" in str(err)
    assert "Did you mean 'actor.megatron.moe_grouped_gemm'?" in str(err)


def test_unknown_key_in_wrong_section_suggests_where_it_lives() -> None:
    # No sibling is close; the nearest key in the whole schema is offered.
    err = _message(None, ("rollout.ppo_mini_batch_size=4",))
    assert "Did you mean 'actor.ppo_mini_batch_size'?" in str(err)


def test_unknown_key_without_a_near_match_lists_valid_keys() -> None:
    err = _message({"zzzz": 1})
    assert str(err).startswith("Unknown config key 'zzzz'. Valid keys at the top level: project_name,")
    assert "checkpoint" in str(err) and "logging" in str(err)


def test_unknown_verl_key_suggests_nearest_alias() -> None:
    err = _message(None, ("actor_rollout_ref.rollout.gpu_memory_utilisation=0.5",))
    assert "'actor_rollout_ref.rollout.gpu_memory_utilisation'" in str(err)
    assert "Did you mean 'actor_rollout_ref.rollout.gpu_memory_utilization'?" in str(err)


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpus", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        ("trainer.total_epoch", "trainer.total_epochs"),
        ("trainer.rollout_data_dir", None),
        ("algorithm.no_think_rl", None),  # not 'algorithm', the section it is in
        ("actor_rollout_ref.rollout.n_agent", None),  # once: 'actor_rollout_ref.rollout.name'
    ],
)
def test_a_verl_key_suggestion_is_one_the_user_meant_or_none(key: str, meant: str | None) -> None:
    err = str(_message(None, (f"{key}=1",)))
    assert (f"Did you mean '{meant}'?" in err) if meant else ("Did you mean" not in err)


def test_wrong_type_message_has_path_value_and_expected_type() -> None:
    err = _message(None, ("rollout.n=five",))
    assert str(err) == (
        "Config key 'rollout.n' has value 'five' but expects int. Use a whole number such as 8."
    )
    assert err.key == "rollout.n"


def test_wrong_type_through_alias_says_how_it_was_written() -> None:
    err = _message(None, ("trainer.n_gpus_per_node=eight",))
    assert "'device.devices_per_node' has value 'eight'" in str(err)
    assert "(It was given as 'trainer.n_gpus_per_node'.)" in str(err)


@pytest.mark.parametrize("text", ["actor.lr", "=3", "actor..lr=3", "actor lr=3"])
def test_malformed_override(text: str) -> None:
    err = _message(None, (text,))
    assert f"Override {text!r} is not of the form dotted.key=value" in str(err)


def test_overrides_given_as_one_string() -> None:
    err = _message(None, "actor.lr=1")  # type: ignore[arg-type]
    assert "wrap it in a list" in str(err)


def test_missing_file_invalid_yaml_and_non_mapping(tmp_path: Path) -> None:
    assert "does not exist" in str(_message(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  lr: 1\n   x: [\n")
    assert "is not valid YAML at line 3" in str(_message(bad))
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    assert "must hold a mapping of keys to values at the top level, not a list" in str(_message(listed))


def test_key_set_twice_through_alias_in_one_file() -> None:
    err = _message({"checkpoint": {"strict": True}, "actor": {"checkpoint": {"strict": False}}})
    assert "'checkpoint.strict' is set twice with different values" in str(err)
    assert "(as 'actor.checkpoint.strict')" in str(err)


def test_later_override_wins_over_file_and_earlier_override() -> None:
    cfg = load({"actor": {"lr": 0.1}}, ["actor.lr=0.2", "actor_rollout_ref.actor.optim.lr=0.3"])
    assert cfg.actor.lr == 0.3
