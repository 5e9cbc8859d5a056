"""Metrics sinks: JSONL (appending across resumes), TensorBoard event files, console line, PNG plot."""

from __future__ import annotations

import json

import numpy as np
from structlog.testing import capture_logs

from grpo_trainer.driver.metrics import MetricsLogger, pick_val_generations, plot_metrics, read_metrics


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


def test_validation_samples_are_picked_as_verl_picks_them() -> None:
    """Sorted by prompt, shuffled with numpy's RandomState(42), the first N: the same prompts each
    validation whatever the order they came in (verl's _maybe_log_val_generations)."""
    inputs = [f"prompt {c}" for c in "gdbface"]
    outputs = [f"answer to {p}" for p in inputs]
    scores = [float(i) for i in range(len(inputs))]
    picked = pick_val_generations(inputs, outputs, scores, 3)
    order = sorted(range(len(inputs)), key=lambda i: inputs[i])
    positions = list(range(len(order)))
    np.random.RandomState(42).shuffle(positions)  # the permutation verl's shuffle applies
    assert picked == [(inputs[order[p]], outputs[order[p]], scores[order[p]]) for p in positions[:3]]
    reversed_in = pick_val_generations(inputs[::-1], outputs[::-1], scores[::-1], 3)
    assert reversed_in == picked
    assert len(pick_val_generations(inputs, outputs, scores, 100)) == len(inputs)


def test_validation_samples_go_to_their_file_and_tensorboard_and_rewind_with_the_metrics(tmp_path) -> None:
    logger = MetricsLogger(tmp_path, console=False, jsonl=True, tensorboard=True)
    for step in (1, 2, 3):
        logger.log(step, {"reward/mean": step / 10})
        logger.log_generations(step, [(f"q{step}", f"a{step}", 1.0), ("q", "a", 0.0)])
    logger.log_generations(4, [])  # no validation this step: nothing written
    assert logger.rewind(1) == 2
    logger.close()
    kept = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert kept == [{"step": 1, "samples": [{"input": "q1", "output": "a1", "score": 1.0}, {"input": "q", "output": "a", "score": 0.0}]}]
    abandoned = (tmp_path / "val_generations.abandoned.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in abandoned] == [2, 3]
    assert list(read_metrics(tmp_path / "metrics.jsonl")) == [1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = [e for e in events.Tensors("val/generations/text_summary") if e.step == 2]
    assert b"**Input:** q2" in text.tensor_proto.string_val[0]
