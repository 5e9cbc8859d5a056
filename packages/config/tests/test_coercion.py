"""Override strings and YAML values are converted by the declared field type."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_config import ConfigError, ParallelConfig, load
from grpo_config.loader import build
from grpo_config.sources import collect


@pytest.mark.parametrize("text", ["False", "false", "FALSE", "0", "no", "off"])
def test_bool_false_spellings(text: str) -> None:
    assert load(None, [f"checkpoint.strict={text}"]).checkpoint.strict is False


@pytest.mark.parametrize("text", ["True", "true", "1", "yes", "on"])
def test_bool_true_spellings(text: str) -> None:
    assert load(None, [f"actor.use_dynamic_bsz={text}"]).actor.use_dynamic_bsz is True


def test_bool_rejects_other_words_and_yaml_numbers() -> None:
    with pytest.raises(ConfigError, match=r"'checkpoint\.strict' has value 'maybe' but expects bool"):
        load(None, ["checkpoint.strict=maybe"])
    with pytest.raises(ConfigError, match=r"has value 2 \(int\) but expects bool"):
        load({"checkpoint": {"strict": 2}})


def test_int_from_text_and_rejections() -> None:
    assert load(None, ["data.max_prompt_length=2048"]).data.max_prompt_length == 2048
    assert load(None, ["checkpoint.save_freq=-1"]).checkpoint.save_freq == -1
    with pytest.raises(ConfigError, match=r"'data\.max_prompt_length' has value '2048\.0' but expects int"):
        load(None, ["data.max_prompt_length=2048.0"])
    # bool is an int subclass in Python; a YAML `true` for an int field is still a mistake.
    with pytest.raises(ConfigError, match=r"'actor\.ppo_epochs' has value True \(bool\) but expects int"):
        load({"actor": {"ppo_epochs": True}})
    with pytest.raises(ConfigError, match=r"value 1\.5 \(float\) but expects int"):
        load({"actor": {"ppo_epochs": 1.5}})


def test_float_scientific_notation_from_override_and_yaml(tmp_path: Path) -> None:
    assert load(None, ["actor.lr=1e-6"]).actor.lr == pytest.approx(1e-6)
    # PyYAML (YAML 1.1) reads `1e-6` as a *string*; the field type turns it into a float.
    path = tmp_path / "c.yaml"
    path.write_text("actor:\n  lr: 1e-6\n  grad_clip: 2\n")
    cfg = load(path)
    assert cfg.actor.lr == pytest.approx(1e-6) and isinstance(cfg.actor.lr, float)
    assert cfg.actor.grad_clip == 2.0 and isinstance(cfg.actor.grad_clip, float)
    with pytest.raises(ConfigError, match=r"'actor\.lr' has value 'fast' but expects float"):
        load(None, ["actor.lr=fast"])


@settings(max_examples=40, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9))
def test_float_override_round_trips_repr(value: float) -> None:
    assert load(None, [f"actor.entropy_coeff={value!r}"]).actor.entropy_coeff == value


@pytest.mark.parametrize("text", ["null", "None", "none", "~"])
def test_optional_null_spellings(text: str) -> None:
    cfg = load(None, ["checkpoint.max_to_keep=3", f"checkpoint.max_to_keep={text}"])
    assert cfg.checkpoint.max_to_keep is None


def test_optional_value_and_plain_str_keeps_none_word() -> None:
    cfg = load(None, ["checkpoint.max_to_keep=3", "checkpoint.resume=none", "reward.custom_fn=pkg.mod:fn"])
    assert cfg.checkpoint.max_to_keep == 3
    assert cfg.checkpoint.resume == "none"  # `resume` is a plain str: "none" is a value, not null
    assert cfg.reward.custom_fn == "pkg.mod:fn"


def test_literal_checked_and_lists_allowed_values() -> None:
    assert load(None, ["actor.loss_agg_mode=seq-mean-token-sum"]).actor.loss_agg_mode == "seq-mean-token-sum"
    with pytest.raises(ConfigError) as info:
        load(None, ["actor.loss_agg_mode=token_mean"])
    message = str(info.value)
    assert "'actor.loss_agg_mode'" in message and "'token_mean'" in message
    for allowed in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert f"'{allowed}'" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[a.parquet,b.parquet]", ["a.parquet", "b.parquet"]),
        ("[a.parquet, 'b c.parquet']", ["a.parquet", "b c.parquet"]),
        ("/data/train.parquet", ["/data/train.parquet"]),
        ("[]", []),
    ],
)
def test_list_from_text(text: str, expected: list[str]) -> None:
    assert load(None, [f"data.train_files={text}"]).data.train_files == expected


def test_list_items_are_type_checked_with_index_in_path() -> None:
    with pytest.raises(ConfigError, match=r"'data\.train_files\[1\]' has value 3 \(int\) but expects str"):
        load({"data": {"train_files": ["a.parquet", 3]}})
    with pytest.raises(ConfigError, match=r"'data\.val_files' has value '\[a, b', which is not valid YAML"):
        load(None, ["data.val_files=[a, b"])


def test_dict_from_yaml_flow_and_dotted_entries() -> None:
    cfg = load(None, ["actor.backend=megatron",
            "actor.megatron.override_transformer_config={recompute_modules: [core_attn], bias_dropout_fusion: false}",
            "actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=3",
        ],
    )
    assert cfg.actor.megatron.override_transformer_config == {
        "recompute_modules": ["core_attn"],
        "bias_dropout_fusion": False,
        "num_layers_in_first_pipeline_stage": 3,
    }
    with pytest.raises(
        ConfigError, match=r"override_transformer_config' has value 'x' \(str\) but expects a mapping"
    ):
        load(None, ["actor.backend=megatron", "actor.megatron.override_transformer_config=x"])


def test_nested_dataclass_from_flow_mapping_and_unknown_field_inside() -> None:
    # Built without the cross-field checks (they refuse a ref layout other than the actor's).
    cfg = build(collect({}, ["device.devices_per_node=4", "ref.parallel={tp: 2, ep: 2}"]))
    assert cfg.ref.parallel == ParallelConfig(tp=2, ep=2)
    with pytest.raises(
        ConfigError, match=r"Unknown config key 'ref\.parallel\.tpp'\. Did you mean 'ref\.parallel\.tp'"
    ):
        load(None, ["actor.backend=megatron", "ref.parallel={tpp: 2}"])


def test_str_field_rejects_yaml_number_with_quote_hint() -> None:
    with pytest.raises(
        ConfigError, match=r"'experiment_name' has value 2024 \(int\) but expects str\. Quote it"
    ):
        load({"experiment_name": 2024})
