"""The run's log file, `<output dir>/run.log`: everything the launcher writes to stderr from the
moment the output folder is locked (the driver's log, the workers' lines Ray forwards, warnings),
and the traceback of a failure, which stderr does not show (one line there names this file).
Each launch appends under a header line, so a resumed run's log follows the first one's."""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

LOG_NAME = "run.log"


class _Tee:
    """A text stream that writes to the terminal's stream and to the log file."""

    def __init__(self, stream: TextIO, file: TextIO) -> None:
        self._stream = stream
        self._file = file

    def write(self, text: str) -> int:
        if not self._file.closed:  # a logger bound to this stream may outlive the launch (atexit)
            self._file.write(text)
            self._file.flush()
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()
        if not self._file.closed:
            self._file.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class RunLog:
    def __init__(self, output_dir: Path) -> None:
        self.path = Path(output_dir) / LOG_NAME
        self._file: TextIO | None = None
        self._stderr: TextIO | None = None

    def start(self, argv: list[str]) -> None:
        """Open the file (append) and copy stderr into it until `stop`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._file.write(f"===== {stamp} launch: {' '.join(argv)}\n")
        self._file.flush()
        self._stderr = sys.stderr
        sys.stderr = _Tee(sys.stderr, self._file)  # type: ignore[assignment]

    def traceback(self, exc: BaseException) -> None:
        """The failure's whole traceback, into the file only."""
        if self._file is not None:
            self._file.write("".join(traceback.format_exception(exc)))
            self._file.flush()

    def stop(self) -> None:
        if self._stderr is not None:
            sys.stderr = self._stderr
            self._stderr = None
        if self._file is not None:
            self._file.close()
            self._file = None
