"""The tiny preset: its Qwen3.5-MoE model, tokenizer, task data, reward and config."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from structlog.testing import capture_logs

import grpo_config
from grpo_launch import tiny_preset
from grpo_launch.presets import TINY_DATA_SOURCE
from grpo_tiny.task import SCORE_FN, score
from grpo_trainer.rewards import RewardManager, UnknownDataSourceError, get_reward_fn, load_custom_fn


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("preset")
    return workdir, tiny_preset(workdir)


def test_config_loads_and_points_into_the_workdir(preset) -> None:
    workdir, raw = preset
    cfg = grpo_config.load(raw)
    assert cfg.rollout.engine == "hf" and cfg.actor.backend == "torch" and cfg.device.kind == "cpu"
    for path in (
        *cfg.data.train_files,
        *cfg.data.val_files,
        cfg.actor.model_path,
        cfg.checkpoint.dir,
        cfg.logging.dir,
    ):
        assert str(path).startswith(str(workdir.resolve()))
    assert cfg.total_training_steps >= 20  # the first-10 / last-10 reward comparison needs 20 steps


def test_model_is_a_shrunk_qwen35_moe(preset) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    _, raw = preset
    path = raw["actor"]["model_path"]
    config = AutoConfig.from_pretrained(path)
    assert config.architectures == ["Qwen3_5MoeForCausalLM"]
    assert {"linear_attention", "full_attention"} <= set(config.layer_types)
    assert config.num_experts > config.num_experts_per_tok > 1 and config.shared_expert_intermediate_size > 0
    assert config.head_dim >= 32 and config.linear_key_head_dim >= 64 and config.linear_value_head_dim >= 64
    model = AutoModelForCausalLM.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert any("shared_expert" in n for n, _ in model.named_parameters())
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "repeat 7"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    assert tokenizer.decode(ids) == "repeat 7"
    assert tokenizer.convert_ids_to_tokens(ids)[-1] == "7"  # the digit is the last prompt token
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert len(tokenizer) < 64  # small vocabulary: a random model emits digits often
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), config.vocab_size)


def test_data_files_are_verl_rows_of_the_tiny_task(preset) -> None:
    _, raw = preset
    rows = pq.read_table(raw["data"]["train_files"][0]).to_pylist()
    assert len(rows) == 256
    assert {r["data_source"] for r in rows} == {TINY_DATA_SOURCE}
    assert len({r["reward_model"]["ground_truth"] for r in rows}) == 10
    first = rows[0]
    assert first["prompt"][0]["role"] == "user"
    assert first["prompt"][0]["content"].endswith(first["reward_model"]["ground_truth"])


def test_building_twice_reuses_what_is_there(preset) -> None:
    workdir, raw = preset
    weights = next((workdir / "model").glob("*.safetensors"))
    mtime = weights.stat().st_mtime_ns
    assert tiny_preset(workdir) == raw
    assert weights.stat().st_mtime_ns == mtime


def test_reward_travels_in_the_config_not_the_registry(preset) -> None:
    _, raw = preset
    assert raw["reward"] == {"custom_fn": "grpo_tiny.task:score"} == {"custom_fn": SCORE_FN}
    assert grpo_config.load(raw).reward.custom_fn == SCORE_FN
    assert load_custom_fn(SCORE_FN) is score
    with pytest.raises(UnknownDataSourceError):  # one mechanism: nothing registered on import
        get_reward_fn(TINY_DATA_SOURCE)


def test_reward_scores_the_share_of_the_digit() -> None:
    assert score("7", "7", None) == 1.0
    assert score(" 7 7 7 ", "7", None) == 1.0
    assert score("7a", "7", None) == 0.5
    assert score("abc", "7", None) == 0.0
    assert score("", "7", None) == 0.0
    with pytest.raises(ValueError, match="one character"):
        score("7", "77", None)
    # By the preset's custom_fn string, in a reward worker process (no fallback to a thread), as in
    # training; custom_fn scores every item whatever its data_source.
    with capture_logs() as logs, RewardManager(timeout_s=10, custom_fn=SCORE_FN) as manager:
        result = manager.score(
            [
                {"solution_str": "3 3x", "ground_truth": "3", "data_source": TINY_DATA_SOURCE},
                {"solution_str": "5", "ground_truth": "5", "data_source": "elsewhere"},
            ]
        )
    assert result.scores == [pytest.approx(2 / 3), 1.0]
    assert (result.n_errors, result.n_timeouts, result.n_unknown_source) == (0, 0, 0)
    assert not [e for e in logs if e["log_level"] == "warning"], logs
