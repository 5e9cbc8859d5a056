"""Structured logging for command-line entry points. Libraries only call `structlog.get_logger()`;
this module is the one place that configures structlog, and only launchers call it (once, at the edge).

Logs go to stderr so that stdout stays clean for what a command prints (the dry-run YAML). The format
follows the log stream: a pretty console on a terminal, one JSON object per line otherwise (CI, files,
cluster log collectors). Standard-library loggers (Ray, transformers, vLLM) are routed through the
same renderer so a JSON log stays parseable line by line.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

LOG_LEVELS = ("debug", "info", "warning", "error")

_HANDLER_NAME = "grpo-launch"


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def configure_logging(*, level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> bool:
    """Configure structlog and the stdlib root logger. `json=None` picks JSON unless `stream` is a TTY.
    Returns whether JSON lines were chosen."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    stream = sys.stderr if stream is None else stream
    use_json = not _is_tty(stream) if json is None else json
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer()
        exc_processors: list[Any] = [structlog.processors.dict_tracebacks]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=True)
        exc_processors = []
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[*_shared_processors(), *exc_processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*_shared_processors(), structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *exc_processors,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    _route_through_root(_SELF_HANDLED_LOGGERS)
    return use_json


_LEVEL_ENV = "GRPO_LOG_LEVEL"
_JSON_ENV = "GRPO_LOG_JSON"


def worker_runtime_env(*, level: str, json: bool) -> dict[str, Any]:
    """Ray's job-level runtime env that configures logging the same way in every worker process
    (`configure_worker_logging` runs there before any actor code)."""
    return {
        "worker_process_setup_hook": "grpo_launch.logging_setup.configure_worker_logging",
        "env_vars": {_LEVEL_ENV: level, _JSON_ENV: "1" if json else "0"},
    }


def configure_worker_logging() -> None:
    """Ray's worker_process_setup_hook: the driver's level and format, to stderr (Ray forwards a
    worker's stderr to the driver)."""
    import os

    configure_logging(level=os.environ.get(_LEVEL_ENV, "info"), json=os.environ.get(_JSON_ENV, "1") == "1")


# Libraries that attach their own stderr handler and stop propagation when imported (Ray does).
_SELF_HANDLED_LOGGERS = ("ray",)


def _route_through_root(names: tuple[str, ...]) -> None:
    for name in names:
        library_logger = logging.getLogger(name)
        for own in list(library_logger.handlers):
            library_logger.removeHandler(own)
        library_logger.propagate = True


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
