"""`prepare-data` on small datasets made here with the real `datasets` library (save_to_disk
directories, directories of json/parquet files), and the launcher's data step that uses it. The hub
is not reachable from the test machines, so hub ids are only exercised for their error path."""

from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
import structlog
from PIL import Image

from grpo_launch import LaunchError
from grpo_launch.dataset_rows import GEO3K_INSTRUCTION, gsm8k_final_answer
from grpo_launch.plan import DataPlan
from grpo_launch.preflight import ensure_data, unset_proxies
from grpo_launch.prepare_data import main as prepare_main
from grpo_launch.prepare_data import prepare_dataset


def _png(color: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (8, 6), color)


def geo3k_dir(root: Path) -> Path:
    """A geometry3k-shaped DatasetDict (images, problem, answer) saved with save_to_disk."""

    def split(n: int, offset: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {
                "images": [[_png((10 * i, 0, 0))] for i in range(offset, offset + n)],
                "problem": [f"<image>Find x in triangle {i}." for i in range(offset, offset + n)],
                "answer": [str(3 + i) for i in range(offset, offset + n)],
            },
            features=datasets.Features(
                {
                    "images": datasets.List(datasets.Image()),
                    "problem": datasets.Value("string"),
                    "answer": datasets.Value("string"),
                }
            ),
        )

    path = root / "geo3k_saved"
    datasets.DatasetDict({"train": split(5, 0), "validation": split(2, 5), "test": split(3, 7)}).save_to_disk(
        path
    )
    return path


def gsm8k_dir(root: Path) -> Path:
    """A gsm8k-shaped hub snapshot: main/train.jsonl and main/test.jsonl (one bad row in train)."""
    main = root / "gsm8k_snapshot" / "main"
    main.mkdir(parents=True)
    train = [
        {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"},
        {"question": "A farm sells 1,000 eggs twice. Total?", "answer": "1,000 * 2 = 2,000\n#### 2,000"},
        {"question": "No final answer here.", "answer": "it is 7"},
    ]
    test = [{"question": "What is 6 * 7?", "answer": "6*7=42\n#### 42"}]
    for name, rows in (("train", train), ("test", test)):
        (main / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return main.parent


def test_geo3k_from_save_to_disk(tmp_path: Path) -> None:
    written = prepare_dataset("geo3k", output_dir=tmp_path / "out", source=str(geo3k_dir(tmp_path)))
    assert sorted(written) == ["test", "train"]
    train = pq.read_table(written["train"]).to_pylist()
    test = pq.read_table(written["test"]).to_pylist()
    assert len(train) == 5 and len(test) == 3  # "test" wins over "validation"
    row = train[1]
    assert row["data_source"] == "hiyouga/geometry3k"
    assert row["prompt"] == [{"role": "user", "content": f"<image>Find x in triangle 1. {GEO3K_INSTRUCTION}"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "4"}
    assert row["extra_info"] == {
        "split": "train",
        "index": 1,
        "question": "<image>Find x in triangle 1.",
        "answer": "4",
    }
    assert row["ability"] == "math"
    # Images stay encoded bytes, as verl-format parquet stores them, and decode to the original.
    (image,) = row["images"]
    assert Image.open(io.BytesIO(image["bytes"])).getpixel((0, 0)) == (10, 0, 0)
    assert test[0]["extra_info"]["split"] == "test" and test[2]["reward_model"]["ground_truth"] == "12"


def test_gsm8k_from_a_file_directory_skips_bad_rows(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        written = prepare_dataset("gsm8k", output_dir=tmp_path / "out", source=str(gsm8k_dir(tmp_path)))
    train = pq.read_table(written["train"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["5", "2000"]
    assert train[0]["data_source"] == "openai/gsm8k"
    assert train[0]["prompt"][0]["content"].startswith(
        "Tom has 2 apples and buys 3. How many? Let's think step by step"
    )
    assert "images" not in pq.read_schema(written["train"]).names
    skipped = [e for e in logs if e["event"] == "rows skipped"]
    assert len(skipped) == 1 and skipped[0]["count"] == 1 and "row 2" in skipped[0]["first"][0]
    assert pq.read_table(written["test"]).to_pylist()[0]["reward_model"]["ground_truth"] == "42"
    assert not list((tmp_path / "out").glob("*.partial"))


def test_gsm8k_final_answer() -> None:
    assert gsm8k_final_answer("so 3,600 total\n#### 3,600 ") == "3600"
    assert gsm8k_final_answer("#### -7") == "-7"
    with pytest.raises(ValueError, match="no '#### <answer>' line"):
        gsm8k_final_answer("the answer is 4")


def test_written_rows_are_valid_trainer_rows_with_a_registered_reward(tmp_path: Path) -> None:
    """The parquet is what grpo_trainer.data reads and grpo_trainer.rewards scores: a correct answer
    in the format each prompt asks for scores 1, a wrong one less."""
    from grpo_trainer.data import DataReport, load_rows
    from grpo_trainer.data.rows import row_problem
    from grpo_trainer.rewards import get_reward_fn

    solutions = {
        "geo3k": lambda truth: f"<think>angles sum to 180</think> \\boxed{{{truth}}}",
        "gsm8k": lambda truth: f"3 and 2 make it.\n#### {truth}",
        "gsm8k_tool": lambda truth: f"The calculator said so.\n#### {truth}",
    }
    gsm8k = gsm8k_dir(tmp_path)
    sources = {"geo3k": geo3k_dir(tmp_path), "gsm8k": gsm8k, "gsm8k_tool": gsm8k}
    for dataset, source in sources.items():
        written = prepare_dataset(dataset, output_dir=tmp_path / dataset, source=str(source))
        report = DataReport()
        rows = load_rows([str(written["train"]), str(written["test"])], report=report)
        assert report.n_malformed == 0 and len(rows) > 1
        for row in rows:
            assert row_problem(row, prompt_key="prompt") is None
            score = get_reward_fn(row["data_source"])
            truth = row["reward_model"]["ground_truth"]
            assert score(solutions[dataset](truth), truth, row["extra_info"]) == pytest.approx(1.0)
            assert score(solutions[dataset]("999"), truth, row["extra_info"]) < 1.0
        # gsm8k_tool: gsm8k's rows and reward, a system turn that asks for the calculator first
        roles = {row["prompt"][0]["role"] for row in rows}
        assert roles == ({"system"} if dataset == "gsm8k_tool" else {"user"})
        if dataset == "gsm8k_tool":
            assert "`calculator` tool" in rows[0]["prompt"][0]["content"]


@pytest.mark.parametrize(
    ("source_kind", "message"),
    [
        ("single_split", "holds a single split"),
        ("wrong_columns", "lacks columns ['problem']"),
        ("no_test_split", "needs one of ['test', 'validation']"),
        ("not_a_path", "neither a directory nor a hub id"),
    ],
)
def test_bad_sources_raise_launch_errors(source_kind: str, message: str, tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"problem": ["p"], "answer": ["1"]})
    if source_kind == "single_split":
        ds.save_to_disk(tmp_path / "src")
    elif source_kind == "wrong_columns":
        bad = datasets.Dataset.from_dict({"question": ["p"], "answer": ["1"]})
        datasets.DatasetDict({"train": bad, "test": bad}).save_to_disk(tmp_path / "src")
    elif source_kind == "no_test_split":
        datasets.DatasetDict({"train": ds}).save_to_disk(tmp_path / "src")
    source = str(tmp_path / "src") if source_kind != "not_a_path" else "no/such/dir/at/all"
    with pytest.raises(LaunchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        prepare_dataset("geo3k", output_dir=tmp_path / "out", source=source)


def test_cli_writes_files_and_reports_errors_with_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    import logging

    handlers = list(logging.getLogger().handlers)
    try:
        src = gsm8k_dir(tmp_path)
        assert (
            prepare_main(["--", "--dataset", "gsm8k", "--source", str(src), "--out", str(tmp_path / "o")])
            == 0
        )
        assert capsys.readouterr().out.splitlines() == [
            f"train: {tmp_path / 'o/train.parquet'}",
            f"test: {tmp_path / 'o/test.parquet'}",
        ]
        assert prepare_main(["--dataset", "geo3k", "--source", str(tmp_path / "missing")]) == 2
        assert "neither a directory nor a hub id" in capsys.readouterr().err
        monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
        assert prepare_main(["--dataset", "gsm8k", "--source", str(src)]) == 0
        assert (tmp_path / "data/gsm8k/train.parquet").is_file()
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = handlers


def test_unreachable_hub_is_a_launch_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(LaunchError, match=r"could not read gsm8k from 'openai/gsm8k'.*--source DIR"):
        prepare_dataset("gsm8k", output_dir=tmp_path / "out", source=None)


def _data_plan(tmp_path: Path, *, source: str, prepare: bool) -> DataPlan:
    directory = tmp_path / "data" / "geo3k"
    return DataPlan(
        dataset="geo3k",
        directory=directory,
        train_files=(str(directory / "train.parquet"),),
        val_files=(str(directory / "test.parquet"),),
        source=source,
        prepare_if_missing=prepare,
    )


def test_launcher_data_step_prepares_the_default_files_once(tmp_path: Path) -> None:
    plan = _data_plan(tmp_path, source=str(geo3k_dir(tmp_path)), prepare=True)
    ensure_data(plan)
    train = Path(plan.train_files[0])
    assert pq.read_table(train).num_rows == 5
    stamp = train.stat().st_mtime_ns
    ensure_data(plan)  # present: not rebuilt
    assert train.stat().st_mtime_ns == stamp


def test_launcher_data_step_never_builds_user_given_files(tmp_path: Path) -> None:
    plan = _data_plan(tmp_path, source=str(geo3k_dir(tmp_path)), prepare=False)
    with pytest.raises(LaunchError, match="data files missing"):
        ensure_data(plan)
    assert not Path(plan.train_files[0]).exists()


def test_proxy_variables_are_unset() -> None:
    environ = {
        "http_proxy": "http://p:3128",
        "HTTPS_PROXY": "http://p:3128",
        "no_proxy": "localhost",
        "X": "1",
    }
    with structlog.testing.capture_logs() as logs:
        removed = unset_proxies(environ)
    assert removed == ["http_proxy", "HTTPS_PROXY"]
    assert environ == {"no_proxy": "localhost", "X": "1"}
    assert logs[0]["names"] == removed and "p:3128" not in str(logs)
    assert unset_proxies(environ) == []
