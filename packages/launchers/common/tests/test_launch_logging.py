"""The launchers' one logging configuration: JSON lines off a terminal, a console renderer on one,
standard-library loggers routed through the same renderer, level filtering. Real structlog and
logging; the "terminal" is a StringIO that answers isatty() with True."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from grpo_launch import configure_logging


class TerminalStream(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging():
    handlers, level = list(logging.getLogger().handlers), logging.getLogger().level
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = handlers
    logging.getLogger().setLevel(level)


def test_json_lines_when_not_a_terminal() -> None:
    import ray  # noqa: F401  (importing Ray gives its logger its own handler; ours must still win)

    stream = io.StringIO()
    assert configure_logging(stream=stream) is True
    structlog.get_logger().info("rollout done", step=3, reward=0.5)
    logging.getLogger("ray.worker").warning("worker %s slow", "w1")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["event"] == "rollout done" and first["step"] == 3 and first["reward"] == 0.5
    assert first["level"] == "info" and first["timestamp"].endswith("Z")
    assert (
        second["event"] == "worker w1 slow"
        and second["logger"] == "ray.worker"
        and second["level"] == "warning"
    )


def test_console_on_a_terminal() -> None:
    stream = TerminalStream()
    assert configure_logging(stream=stream) is False
    structlog.get_logger().info("rollout done", step=3)
    text = stream.getvalue()
    assert "rollout done" in text and "step" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_level_filters_both_structlog_and_stdlib() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream, level="warning")
    structlog.get_logger().info("hidden")
    logging.getLogger("x").info("hidden too")
    structlog.get_logger().warning("shown")
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["shown"]


def test_exceptions_are_structured_in_json() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        structlog.get_logger().exception("step failed")
    event = json.loads(stream.getvalue())
    assert (
        event["exception"][0]["exc_type"] == "RuntimeError" and event["exception"][0]["exc_value"] == "boom"
    )


def test_reconfiguring_keeps_one_handler_and_rejects_bad_levels() -> None:
    configure_logging(stream=io.StringIO())
    configure_logging(stream=io.StringIO())
    assert sum(h.get_name() == "grpo-launch" for h in logging.getLogger().handlers) == 1
    with pytest.raises(ValueError, match="log level 'loud' is not one of debug, info, warning, error"):
        configure_logging(level="loud")
