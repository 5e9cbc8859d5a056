"""Prompt data: real parquet (pyarrow) and jsonl files written to tmp dirs, tokenised with a real
transformers fast tokenizer trained on the fly (word level) and given a small chat template."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from structlog.testing import capture_logs
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from grpo_trainer.data import (
    DataFileError,
    DataReport,
    OverlongPromptError,
    PromptDataset,
    load_rows,
)

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<unk>", "<|system|>", "<|user|>", "<|assistant|>"]


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    corpus = ["what is one plus two", "solve for x", "be brief", "a b c d e f g h i j"]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=SPECIALS))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    hf.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    hf.chat_template = TEMPLATE
    return hf


def ids(tokenizer, words):
    return tokenizer.convert_tokens_to_ids(words.split())


def chat_row(content, *, gt="3", source="lighteval/MATH", extra=None, system=None):
    prompt = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": content}
    ]
    row = {"prompt": prompt, "data_source": source, "reward_model": {"style": "rule", "ground_truth": gt}}
    if extra is not None:
        row["extra_info"] = extra
    return row


def write_jsonl(path, rows, raw_lines=()):
    lines = [json.dumps(r) for r in rows] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_load_rows_reads_parquet_and_jsonl_in_order(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", [chat_row("solve for x", extra={"split": "train", "index": 0})])
    b = write_jsonl(tmp_path / "b.jsonl", [chat_row("be brief", gt="7")], raw_lines=["{not json"])
    report = DataReport()
    rows = load_rows([a, str(b)], report=report)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["3", "7"]
    assert rows[0]["prompt"] == [{"role": "user", "content": "solve for x"}]
    assert rows[0]["extra_info"] == {"split": "train", "index": 0}
    assert (report.n_rows, report.n_kept, report.n_malformed) == (3, 2, 1)
    assert report.reasons == [
        "row 2 (b.jsonl:2): invalid JSON (Expecting property name enclosed in double quotes)"
    ]


def test_load_rows_json_array_and_bad_files(tmp_path):
    arr = tmp_path / "rows.json"
    arr.write_text(json.dumps([chat_row("be brief"), chat_row("solve for x")]))
    assert len(load_rows(arr)) == 2
    with pytest.raises(DataFileError, match="does not exist"):
        load_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataFileError, match="unsupported suffix"):
        load_rows(tmp_path / "rows.csv")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFileError, match="cannot read parquet"):
        load_rows(tmp_path / "bad.parquet")


def test_dataset_applies_chat_template_with_generation_prompt(tokenizer, tmp_path):
    path = write_parquet(
        tmp_path / "train.parquet",
        [
            chat_row("what is one plus two", system="be brief", extra={"index": 5}),
            chat_row("solve for x", gt="x=1", source="openai/gsm8k"),
        ],
    )
    ds = PromptDataset(path, tokenizer, max_prompt_length=64)
    assert len(ds) == 2
    first = ds[0]
    assert first.prompt_ids == ids(
        tokenizer, "<|system|> be brief <|user|> what is one plus two <|assistant|>"
    )
    assert (first.ground_truth, first.data_source, first.extra_info, first.index) == (
        "3",
        "lighteval/MATH",
        {"index": 5},
        0,
    )
    assert ds[1].prompt_ids == ids(tokenizer, "<|user|> solve for x <|assistant|>")
    assert (ds[1].ground_truth, ds[1].data_source, ds[1].extra_info) == ("x=1", "openai/gsm8k", {})
    assert ds.report.n_kept == 2 and ds.report.n_malformed == 0


def test_malformed_rows_are_counted_reported_and_skipped(tokenizer, tmp_path):
    bad = [
        {"data_source": "s", "reward_model": {"ground_truth": "1"}},  # no prompt
        {"prompt": [{"role": "user"}], "data_source": "s", "reward_model": {"ground_truth": "1"}},
        {"prompt": [{"role": "user", "content": "a"}], "reward_model": {"ground_truth": "1"}},
        {"prompt": [{"role": "user", "content": "a"}], "data_source": "s", "reward_model": {}},
        chat_row("a", extra=["not", "a", "dict"]),
        [1, 2, 3],
    ]
    path = write_jsonl(
        tmp_path / "mixed.jsonl", [chat_row("be brief"), *bad, chat_row("solve for x")], ["{oops"]
    )
    with capture_logs() as logs:
        ds = PromptDataset(path, tokenizer, max_prompt_length=64)
    assert [item.index for item in ds] == [0, 7]
    report = ds.report
    assert (report.n_rows, report.n_malformed, report.n_kept) == (9, 7, 2)
    assert len(report.reasons) == 5  # only the first few are kept
    assert report.reasons[0] == "row 1 (mixed.jsonl:2): missing 'prompt'"
    assert "needs string 'role' and 'content'" in report.reasons[1]
    assert "data_source" in report.reasons[2]
    assert "reward_model.ground_truth" in report.reasons[3]
    assert "extra_info" in report.reasons[4]
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["count"] == 7
    assert "7 malformed" in report.summary()


def test_dataset_with_no_usable_rows_raises(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": []}])
    with pytest.raises(ValueError, match=r"no usable prompts.*1 malformed"):
        PromptDataset(path, tokenizer, max_prompt_length=64)


@pytest.fixture
def long_file(tmp_path):
    rows = [chat_row("be brief"), chat_row("a b c d e f g h i j"), chat_row("solve for x")]
    return write_jsonl(tmp_path / "long.jsonl", rows)


def test_overlong_filter(tokenizer, long_file):
    ds = PromptDataset(long_file, tokenizer, max_prompt_length=6, overlong="filter")
    assert [item.index for item in ds] == [0, 2]
    assert ds.report.n_filtered_overlong == 1


def test_overlong_truncate_left_and_right(tokenizer, long_file):
    full = ids(tokenizer, "<|user|> a b c d e f g h i j <|assistant|>")
    left = PromptDataset(long_file, tokenizer, max_prompt_length=6, overlong="truncate_left")
    right = PromptDataset(long_file, tokenizer, max_prompt_length=6, overlong="truncate_right")
    assert left[1].prompt_ids == full[-6:]  # keeps the generation prompt
    assert right[1].prompt_ids == full[:6]
    assert left.report.n_truncated == right.report.n_truncated == 1
    assert len(left) == len(right) == 3


def test_overlong_error_names_the_row(tokenizer, long_file):
    with pytest.raises(
        OverlongPromptError, match=r"row 1 \(long.jsonl:2\) has a 12-token prompt.*max_prompt_length=6"
    ):
        PromptDataset(long_file, tokenizer, max_prompt_length=6, overlong="error")


def test_without_chat_template_contents_are_joined_with_one_warning(tokenizer, tmp_path):
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="<unk>")
    assert not plain.chat_template
    path = write_jsonl(
        tmp_path / "p.jsonl", [chat_row("solve for x", system="be brief"), chat_row("be brief")]
    )
    with capture_logs() as logs:
        ds = PromptDataset(path, plain, max_prompt_length=64)
    assert ds[0].prompt_ids == ids(tokenizer, "be brief solve for x")
    assert sum("no chat template" in entry["event"] for entry in logs) == 1


def test_string_prompt_and_apply_chat_template_false(tokenizer, tmp_path):
    row = {"prompt": "solve for x", "data_source": "s", "reward_model": {"ground_truth": 1}}
    path = write_jsonl(tmp_path / "s.jsonl", [row])
    raw = PromptDataset(path, tokenizer, max_prompt_length=64, apply_chat_template=False)
    assert raw[0].prompt_ids == ids(tokenizer, "solve for x")
    assert raw[0].ground_truth == 1
    templated = PromptDataset(path, tokenizer, max_prompt_length=64)
    assert templated[0].prompt_ids == ids(tokenizer, "<|user|> solve for x <|assistant|>")


def test_invalid_arguments(tokenizer, long_file):
    with pytest.raises(ValueError, match="unknown overlong mode"):
        PromptDataset(long_file, tokenizer, max_prompt_length=6, overlong="drop")
    with pytest.raises(ValueError, match="max_prompt_length"):
        PromptDataset(long_file, tokenizer, max_prompt_length=0)


def test_public_api_is_frozen():
    import grpo_trainer.data

    assert grpo_trainer.data.__all__ == [
        "OVERLONG_MODES",
        "DataFileError",
        "DataReport",
        "OverlongPromptError",
        "PromptDataset",
        "PromptItem",
        "ResumableSampler",
        "datasets_for",
        "load_rows",
    ]


def test_the_data_section_names_the_datasets(tmp_path, tokenizer):
    """`datasets_for(cfg.data, ...)`: the training set always, the validation set when val_files is
    set, each with the section's prompt key, length limit and overlong handling."""
    from grpo_config.schema import DataConfig
    from grpo_trainer.data import datasets_for

    rows = [chat_row("solve for x", extra={"index": i}) for i in range(3)]
    path = write_parquet(tmp_path / "t.parquet", rows)
    with pytest.raises(ValueError, match=r"data\.train_files is empty"):
        datasets_for(DataConfig(train_files=[]), tokenizer, None)
    train, val = datasets_for(DataConfig(train_files=[str(path)], val_files=[]), tokenizer, None)
    assert len(train) == 3 and val is None
    train, val = datasets_for(DataConfig(train_files=[str(path)], val_files=[str(path)]), tokenizer, None)
    assert len(train) == len(val) == 3
    with pytest.raises(ValueError, match="3 overlong filtered"):  # every prompt is longer than 2 tokens
        datasets_for(DataConfig(train_files=[str(path)], max_prompt_length=2), tokenizer, None)
