"""Metrics sinks: JSONL (appending across resumes), TensorBoard event files, console line, PNG plot."""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from grpo_trainer.metrics import MetricsLogger, plot_metrics, read_metrics


def test_jsonl_tensorboard_console_and_plot(tmp_path) -> None:
    logger = MetricsLogger(tmp_path, console=True, jsonl=True, tensorboard=True)
    with capture_logs() as logs:
        for step in range(1, 4):
            logger.log(
                step, {"reward/mean": 0.1 * step, "actor/kl": 0.01, "response_length/mean": 7.0, "note": "x"}
            )
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "note" not in rows[0]
    assert rows[2]["reward/mean"] == 0.30000000000000004
    assert [e["step"] for e in logs if e["event"] == "train.step"] == [1, 2, 3]
    assert logs[0]["reward_mean"] == 0.1
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))

    with capture_logs() as quiet:
        again = MetricsLogger(tmp_path / "quiet", console=True, jsonl=False, tensorboard=False)
        again.log(1, {"reward/mean": 0.5}, console=False)  # a step's record repeated: not shown twice
    assert quiet == []

    resumed = MetricsLogger(tmp_path, console=False, jsonl=True, tensorboard=False)
    resumed.log(3, {"reward/mean": 0.9})  # a step redone after a resume: the last record wins
    resumed.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert list(records) == [1, 2, 3] and records[3] == {"reward/mean": 0.9}

    with (tmp_path / "metrics.jsonl").open("a") as cut:
        cut.write('{"step": 4, "reward/me')  # a kill in the middle of a write
    with capture_logs() as warned:
        assert list(read_metrics(tmp_path / "metrics.jsonl")) == [1, 2, 3]
    assert warned[0]["event"] == "metrics.unreadable_record" and warned[0]["line"] == 5

    png = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
