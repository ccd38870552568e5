"""`--log-format json`: one JSON object a line, with the call's trace where one is being served."""

from __future__ import annotations

import json
import logging

from runtime.calls.tracing import CURRENT
from runtime.node.logs import JsonLines


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            info = sys.exc_info()
    return logging.LogRecord("mesh.dispatch", logging.WARNING, __file__, 1, message, args, info)


def test_a_line_is_one_json_object_with_the_message_formatted() -> None:
    line = JsonLines().format(_record("could not answer %s: %s", "mesh.tool.a.b", 'a "quoted"\nline'))
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING" and data["logger"] == "mesh.dispatch"
    assert data["message"] == 'could not answer mesh.tool.a.b: a "quoted"\nline'
    assert data["time"].endswith("+00:00") and "trace_id" not in data


def test_a_line_written_while_a_call_is_served_names_its_trace() -> None:
    token = CURRENT.set(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
    try:
        data = json.loads(JsonLines().format(_record("x")))
    finally:
        CURRENT.reset(token)
    assert (data["trace_id"], data["span_id"]) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


def test_an_exception_travels_in_its_own_field() -> None:
    data = json.loads(JsonLines().format(_record("failed", exc=True)))
    assert "ValueError: boom" in data["exception"] and data["message"] == "failed"
