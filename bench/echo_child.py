"""The benchmark's raw echo child: a stdlib-only MCP server over stdio with one tool, `echo`.

It does as little as a child can so that what is measured is the path to it, not the child:
one blocking read loop, `json` from the standard library, one `os.write` per answer. Calls are
answered in the order they arrive, each by its id, so many calls may be in flight at once.

BENCH_PROTOCOL forces the revision it answers `initialize` with (to show that children of every
revision from 2024-11-05 to 2025-11-25 are served); without it, it answers the one offered.
BENCH_TOOLS="<n>:<bytes>" lists n echo tools `gen00`, `gen01`, ... of about that many bytes of
definition each instead (a catalogue of a known size: bench/catalog.py).
"""

from __future__ import annotations

import json
import os
import sys

REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
FORCED = os.environ.get("BENCH_PROTOCOL", "")
TOOLS = [
    {
        "name": "echo",
        "description": "Answer with the arguments it was given.",
        "inputSchema": {"type": "object", "additionalProperties": True},
    }
]

_dumps = json.JSONEncoder(separators=(",", ":")).encode
_loads = json.loads


def _generated(spec: str) -> list[dict]:
    count, _, size = spec.partition(":")
    tools = []
    for i in range(int(count)):
        tool = {"name": f"gen{i:02}", "description": "", "inputSchema": {"type": "object", "additionalProperties": True}}
        pad = max(0, int(size or 0) - len(_dumps(tool)))
        tool["description"] = (f"Generated tool {i}: answers with its arguments. " + "." * pad)[:pad]
        tools.append(tool)
    return tools


if os.environ.get("BENCH_TOOLS"):
    TOOLS = _generated(os.environ["BENCH_TOOLS"])


def _send(message: dict) -> None:
    data = (_dumps(message) + "\n").encode()
    while data:  # a pipe may take fewer bytes than offered
        data = data[os.write(1, data):]


def _answer(message: dict) -> dict | None:
    method = message.get("method")
    rid = message.get("id")
    if method == "tools/call":
        args = (message.get("params") or {}).get("arguments") or {}
        text = _dumps(args)
        return {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}], "isError": False}}
    if rid is None:
        return None  # notifications (initialized, cancelled) need no answer
    if method == "initialize":
        offered = (message.get("params") or {}).get("protocolVersion", REVISIONS[-1])
        version = FORCED or (offered if offered in REVISIONS else REVISIONS[-1])
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "bench-echo", "version": "1"},
        }
        return {"jsonrpc": "2.0", "id": rid, "result": result}
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": rid, "result": {}}
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}}


def main() -> None:
    for line in sys.stdin.buffer:  # closing stdin means "exit now"
        try:
            message = _loads(line)
        except ValueError:
            _send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
            continue
        reply = _answer(message)
        if reply is not None:
            _send(reply)


if __name__ == "__main__":
    main()
