"""The verl seed recipes (tests/verl_recipes/, copied from the seed scripts' overrides) through
`from-verl`: every line maps onto a grpo setting that holds its value, or is refused by name with
the reason. No line gets "Unknown config key"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import grpo_config
from grpo_config.aliases import resolve_alias
from grpo_config.from_verl import convert, last_of_each_key, overrides_from_script

RECIPES = Path(__file__).parent / "verl_recipes"
FILES = sorted(RECIPES.glob("*.txt"))

# What grpo refuses in each recipe, by key (the reasons are checked below).
REFUSED = {
    "qwen35_35b_gpu": set(),
    "qwen35_35b_npu": {
        "actor_rollout_ref.actor.megatron.use_remove_padding",
        "actor_rollout_ref.model.use_remove_padding",
    },
    "qwen35_122b_gpu": set(),
    "qwen35_122b_npu": set(),
}
REASONS = {
    "actor_rollout_ref.actor.megatron.use_remove_padding": "cannot be honoured on the Megatron backend yet",
    "actor_rollout_ref.model.use_remove_padding": "cannot be honoured on the Megatron backend yet",
}


def _key(line: str) -> str:
    return line.partition("=")[0].strip().lstrip("+")


def _lookup(cfg: object, dotted: str) -> object:
    node = cfg
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_recipe_line_is_mapped_or_refused_with_its_reason(path: Path) -> None:
    lines = overrides_from_script(path.read_text())
    assert len(lines) == len(path.read_text().splitlines())
    conversion = convert(lines)
    refused = {_key(line): reason for line, reason in conversion.refused}
    assert set(refused) == REFUSED[path.stem]
    for key, reason in refused.items():
        assert "Unknown config key" not in reason
        assert REASONS[key] in reason, reason
    total = len(conversion.accepted) + len(conversion.inert) + len(conversion.refused)
    assert total == len(last_of_each_key(lines)) + 1  # + strategy


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_mapped_line_keeps_its_value(path: Path) -> None:
    conversion = convert(overrides_from_script(path.read_text()))
    cfg = grpo_config.to_dict(grpo_config.loader.build(grpo_config.sources.collect(conversion.settings, [])))
    assert cfg["actor"]["backend"] == "megatron"  # verl's Megatron keys: its Megatron trainer
    checked = 0
    for line in conversion.accepted:
        _, _, text = line.partition("=")
        target = resolve_alias(_key(line)) or _key(line)
        try:
            ours = _lookup(cfg, target)
        except (KeyError, AttributeError):
            continue  # keys with no setting of their own (accepted at grpo's value): test_aliases
        theirs = yaml.safe_load(text)
        if isinstance(ours, float) and isinstance(theirs, str):
            theirs = float(theirs)  # YAML 1.1 reads 1e-6 as text; Hydra and grpo_config as a float
        assert ours == theirs, (line, ours)
        checked += 1
    assert checked >= len(conversion.accepted) - 4


def test_the_converted_recipes_load_except_where_a_refusal_leaves_a_conflict() -> None:
    for path in FILES:
        conversion = convert(overrides_from_script(path.read_text()))
        if path.stem == "qwen35_35b_npu":
            # Dynamic batch sizes with pipeline parallelism: refused until the pipeline schedule
            # takes micro-batches of varying shape.
            assert conversion.problems is not None and "with parallel.pp=2 is not supported" in conversion.problems
        else:
            assert conversion.problems is None, (path.stem, conversion.problems)
            grpo_config.load(conversion.settings)


def test_a_verl_script_is_read_with_its_shell_variables(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("BATCH", raising=False)
    script = tmp_path / "run_qwen3_5.sh"
    script.write_text(
        "#!/usr/bin/env bash\n"
        "set -x\n"
        "export VLLM_USE_V1=1\n"
        'MODEL_PATH=${MODEL_PATH:-"$HOME/models/Qwen3.5-35B-A3B"}\n'
        "TP=2\n"
        "python3 -m verl.trainer.main_ppo --config-path=config \\\n"
        "    --config-name='ppo_megatron_trainer.yaml' \\\n"
        "    actor_rollout_ref.model.path=$MODEL_PATH \\\n"
        "    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=${TP} \\\n"
        "    trainer.logger='[\"console\"]' \\\n"
        "    data.train_batch_size=${BATCH:-32} $@\n"
    )
    lines = overrides_from_script(script.read_text())
    assert lines == [
        "actor_rollout_ref.model.path=/home/u/models/Qwen3.5-35B-A3B",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        'trainer.logger=["console"]',
        "data.train_batch_size=32",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_config.from_verl", str(script)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HOME": "/home/u"},
    )
    assert proc.returncode == 2  # TP=2 on the default single device: reported, YAML still written
    settings = yaml.safe_load(proc.stdout)
    assert settings["parallel"] == {"tp": 2} and settings["data"] == {"train_batch_size": 32}
    assert settings["logging"] == {"console": True, "tensorboard": False, "wandb": False}
    assert settings["actor"] == {"backend": "megatron", "model_path": "/home/u/models/Qwen3.5-35B-A3B"}
    assert "added: actor_rollout_ref.actor.strategy=megatron" in proc.stderr
    assert "4 lines mapped, 0 inert, 0 refused" in proc.stderr and "parallel.tp" in proc.stderr


DAPO_GSPO_TIS = """
algorithm.adv_estimator=grpo
data.gen_batch_size=24
data.train_batch_size=8
algorithm.filter_groups.enable=True
algorithm.filter_groups.metric=acc
algorithm.filter_groups.max_num_gen_batches=10
actor_rollout_ref.actor.policy_loss.loss_mode=gspo
actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
actor_rollout_ref.actor.clip_ratio_low=0.0003
actor_rollout_ref.actor.clip_ratio_high=0.0004
+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
+reward_model.reward_kwargs.overlong_buffer_cfg.len=64
+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
reward_model.overlong_buffer.log=False
algorithm.rollout_correction.rollout_is=token
algorithm.rollout_correction.rollout_is_threshold=2.0
actor_rollout_ref.actor.tis_imp_ratio_cap=2.0
"""


def test_an_algorithm_recipe_maps_as_a_whole_and_only_the_legacy_tis_key_is_refused() -> None:
    """Settings that need one another (dynamic sampling's sizes and its switch, GSPO and its
    aggregation, the overlong buffer's size and its switch) are judged beside the script's other
    lines, not each alone."""
    conversion = convert([line for line in DAPO_GSPO_TIS.splitlines() if line.strip()])
    assert [line for line, _ in conversion.refused] == ["actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"]
    assert "rollout_is=token" in conversion.refused[0][1]
    assert conversion.problems is None
    settings = conversion.settings
    assert settings["data"]["gen_batch_size"] == 24
    assert settings["actor"]["policy_loss"] == {"loss_mode": "gspo"}
    assert settings["reward"]["overlong_buffer"] == {"enable": True, "len": 64, "penalty_factor": 1.0, "log": False}
    # A conflict is still refused, with the line that brings it.
    clash = convert(
        [
            "data.gen_batch_size=24",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=seq_final_reward",
            "algorithm.use_kl_in_reward=True",
        ]
    )
    refused = [line for line, _ in clash.refused]
    assert "algorithm.filter_groups.metric=seq_final_reward" in refused
    assert clash.problems is None, clash.problems  # what is kept still loads together
    # One unmappable line does not make the others be judged alone.
    odd = convert(["data.gen_batch_size=24", "algorithm.filter_groups.enable=True", "algorithm.adv_estimator=gae"])
    assert [line for line, _ in odd.refused] == ["algorithm.adv_estimator=gae"]


def test_values_inside_a_mapping_setting_reach_the_yaml_as_hydra_gives_them() -> None:
    """A dotted override into an untyped mapping (`rollout.engine_kwargs`) carries the value Hydra
    would give: verl's flagship Qwen3.5-397B script sets a quoted cudagraph mode there, which once
    reached the YAML writer as override text it could not represent (a 20-line traceback, exit 1)."""
    conversion = convert([
        '+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY',
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=256",
        '+actor_rollout_ref.rollout.engine_kwargs.vllm.tag="512"',
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.sizes=[1, 2]",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.off=null",
    ])
    assert not conversion.refused
    assert yaml.safe_load(conversion.to_yaml())["rollout"]["engine_kwargs"] == {
        "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
        "max_num_seqs": 256,
        "tag": "512",
        "sizes": [1, 2],
        "off": None,
    }
    broken = convert(["+actor_rollout_ref.rollout.engine_kwargs.vllm.sizes=[1, 2"])
    assert [reason for _, reason in broken.refused] == [
        "Config key 'rollout.engine_kwargs.sizes' has value '[1, 2', which is not valid YAML (expected ',' or "
        "']', but got '<stream end>'); it expects any value, e.g. '[a, b]' for a list or '{k: v}' for a mapping. "
        "(It was given as 'actor_rollout_ref.rollout.engine_kwargs.vllm.sizes'.)"
    ]


@pytest.mark.parametrize(
    ("lines", "config_name", "decided_by"),
    [
        # model_engine in a trailing array, after the Megatron keys it decides
        (["actor_rollout_ref.actor.megatron.param_offload=True", "model_engine=megatron"], None, "model_engine=megatron"),
        (["actor_rollout_ref.actor.megatron.param_offload=True"], "ppo_megatron_trainer.yaml", "--config-name=ppo_megatron_trainer.yaml"),
        (["actor_rollout_ref.actor.megatron.param_offload=True"], None, "verl's Megatron keys"),
        (["actor_rollout_ref.actor.megatron.param_offload=True", "actor_rollout_ref.actor.strategy=megatron"], "ppo_trainer", "actor_rollout_ref.actor.strategy=megatron"),
    ],
)
def test_the_backend_is_decided_from_the_whole_call_whatever_the_order(lines, config_name, decided_by) -> None:
    """verl picks its engine from the whole command line: the Megatron lines before the line that
    selects Megatron are mapped, not refused as torch-backend settings, and the summary says why."""
    conversion = convert(lines, config_name=config_name)
    assert not conversion.refused
    assert conversion.settings["actor"]["backend"] == "megatron"
    assert conversion.settings["actor"]["megatron"] == {"param_offload": True}
    assert conversion.engines == f"backend megatron ({decided_by}), rollout vllm, algorithm grpo"


def test_without_a_megatron_signal_the_backend_is_verls_default() -> None:
    conversion = convert(["actor_rollout_ref.rollout.name=vllm", "algorithm.adv_estimator=rloo"], config_name="ppo_trainer")
    assert conversion.engines == "backend torch (verl's default config), rollout vllm, algorithm rloo"
    assert not conversion.inferred


def test_a_refused_backend_line_takes_no_other_line_with_it() -> None:
    conversion = convert(["model_engine=fsdp", "data.train_batch_size=8"])
    assert [line for line, _ in conversion.refused] == ["model_engine=fsdp"]
    assert conversion.settings == {"data": {"train_batch_size": 8}}
    assert conversion.engines == "backend torch (model_engine=fsdp, refused), rollout vllm, algorithm grpo"


def test_a_reference_training_setting_equal_to_the_actors_is_inert_not_a_crash() -> None:
    """verl's Qwen2-7B Megatron example sets gradient_accumulation_fusion for actor and ref; the
    frozen reference has no such setting, and one equal to the actor's sets nothing (from-verl once
    ended with a KeyError traceback there)."""
    conversion = convert([
        "actor_rollout_ref.actor.strategy=megatron",
        "++actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=False",
        "++actor_rollout_ref.ref.megatron.override_transformer_config.gradient_accumulation_fusion=False",
    ])
    assert conversion.settings["actor"]["megatron"] == {"gradient_accumulation_fusion": False}
    assert [line for line, _ in conversion.inert] == [
        "++actor_rollout_ref.ref.megatron.override_transformer_config.gradient_accumulation_fusion=False"
    ]
    assert "ref" not in conversion.settings and not conversion.refused


def test_verl_defaults_grpo_shares_are_inert_and_other_values_refused() -> None:
    """Keys with no grpo setting whose value is verl's default (what grpo does) set nothing: listed as
    inert with the reason; another value is refused, naming what grpo has instead."""
    conversion = convert([
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4",
        "trainer.default_hdfs_dir=null",
        "actor_rollout_ref.rollout.data_parallel_size=1",
        "actor_rollout_ref.rollout.expert_parallel_size=2",
    ])
    assert [line for line, _ in conversion.inert] == [
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "trainer.default_hdfs_dir=null",
        "actor_rollout_ref.rollout.data_parallel_size=1",
    ]
    refused = dict(conversion.refused)
    assert "parallel.cp" in refused["actor_rollout_ref.ref.ulysses_sequence_parallel_size=4"]
    assert "(only 1 is accepted)" in refused["actor_rollout_ref.rollout.expert_parallel_size=2"]


@pytest.mark.parametrize(
    ("lines", "per_device"),
    [
        # FSDP: the world over the Ulysses size (verl's fsdp_workers); verl's default world is 1 x 8
        (["actor_rollout_ref.actor.ppo_micro_batch_size=64"], 8),
        (["actor_rollout_ref.actor.ppo_micro_batch_size=64", "trainer.n_gpus_per_node=4", "trainer.nnodes=2"], 8),
        (["actor_rollout_ref.actor.ppo_micro_batch_size=32", "trainer.n_gpus_per_node=4"], 8),
        # Megatron: the data-parallel size, the world over tensor x pipeline x context (megatron_workers)
        (
            ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.ppo_micro_batch_size=32",
             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
            8,
        ),
    ],
)
def test_verls_global_micro_batch_sizes_are_divided_by_the_data_parallel_size(lines, per_device) -> None:
    """verl's deprecated global sizes become the per-device ones its workers divide them into; the
    line is reported as the script wrote it."""
    conversion = convert(lines)
    assert conversion.settings["actor"]["ppo_micro_batch_size_per_device"] == per_device
    written = next(line for line in lines if line.startswith("actor_rollout_ref.actor.ppo_micro_batch_size="))
    assert written in conversion.accepted and not conversion.refused


def test_verls_global_micro_batch_sizes_null_is_inert_and_a_size_below_one_device_refused() -> None:
    conversion = convert([
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=null",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size=4",
    ])
    assert [line for line, _ in conversion.inert] == ["actor_rollout_ref.rollout.log_prob_micro_batch_size=null"]
    refused = dict(conversion.refused)
    # 4 over verl's default 8 devices is less than one row a device; and a key given both ways
    assert "deprecated global micro-batch size" in refused["actor_rollout_ref.actor.ppo_micro_batch_size=4"]
    assert "deprecated global micro-batch size" in refused["actor_rollout_ref.ref.log_prob_micro_batch_size=4"]
    assert conversion.settings["ref"] == {"log_prob_micro_batch_size_per_device": 2}


def test_multi_turn_keys_map_and_verls_interactions_are_refused_with_the_reason() -> None:
    conversion = convert([
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=/tools.yaml",
        "actor_rollout_ref.rollout.multi_turn.function_tool_path=/tools.py",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path=/interaction.yaml",
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=strict",
        "data.train_batch_size=8",
    ])
    assert conversion.settings["rollout"]["multi_turn"] == {
        "enable": True,
        "max_assistant_turns": 5,
        "format": "hermes",
        "tool_config_path": "/tools.yaml",  # read when the run starts (tests/tools/test_verl_yaml.py)
        "function_tool_path": "/tools.py",
    }
    assert [line for line, _ in conversion.refused] == [
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path=/interaction.yaml"
    ]
    assert "verl's interactions" in conversion.refused[0][1]
    assert [line for line, _ in conversion.inert] == [
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=strict"
    ]
