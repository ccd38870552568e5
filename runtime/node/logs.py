"""The node's log lines: text (the default) or one JSON object a line (`--log-format json`).

A JSON line carries `trace_id` and `span_id` where it was written while a call was being served
with tracing on (runtime/calls/tracing.py CURRENT), so a collector can join logs and traces.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys

import msgspec

from runtime.calls.tracing import CURRENT

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")

_encode = msgspec.json.Encoder().encode


class JsonLines(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message; trace ids where known;
    the exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = CURRENT.get()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return _encode(line).decode()


def setup_logging(level: str, form: str = "text") -> None:
    """The process's log on stderr, at `level`, as `form` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if form == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
