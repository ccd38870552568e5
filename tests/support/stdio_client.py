"""A minimal blocking MCP-over-stdio client for tests that drive one child directly.

It speaks exactly what the node's launcher speaks (newline-delimited JSON-RPC 2.0), so a
bundle that passes here will pass behind the node. Not used by the runtime itself.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = "2025-11-25"


class StdioClient:
    def __init__(self, argv: list[str], cwd: Path | str | None = None, env: dict[str, str] | None = None) -> None:
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._next = 0

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        while True:
            assert self.proc.stdout is not None and self.proc.stderr is not None
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"child closed stdout; stderr: {self.proc.stderr.read().decode(errors='replace')}")
            reply = json.loads(line)
            # A response of ours: a request of the server's may carry the same id (it numbers its own).
            if reply.get("id") == self._next and "method" not in reply:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                return reply["result"]

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)

    def initialize(self) -> dict[str, Any]:
        result = self.request(
            "initialize",
            {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}},
        )
        self.notify("notifications/initialized")
        return result

    def list_tools(self) -> list[dict[str, Any]]:
        return self.request("tools/list", {})["tools"]

    def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """One tools/call, answered before it returns; `meta` is sent as params._meta (the node's
        caller, a progress token)."""
        return self.request("tools/call", _call_params(name, arguments, meta))

    def send_call(self, ident: int, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> None:
        """Write a tools/call without reading its reply (read it with read_replies)."""
        self._send(
            {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": _call_params(name, arguments, meta)}
        )

    def read_replies(self, count: int, timeout: float) -> list[dict[str, Any]]:
        """`count` stdout lines, each parsed as JSON-RPC (stdout must carry only protocol).

        A reader thread does the blocking reads, so a child that never answers fails the test
        after `timeout` instead of hanging it.
        """
        stdout = self.proc.stdout
        assert stdout is not None
        lines: queue.Queue[bytes] = queue.Queue()

        def read() -> None:
            for _ in range(count):
                lines.put(stdout.readline())

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        replies: list[dict[str, Any]] = []
        for _ in range(count):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"only {len(replies)} of {count} replies within {timeout}s") from None
            assert line, "child closed stdout"
            replies.append(json.loads(line))
        return replies

    def calls_in_flight(
        self, calls: dict[int, tuple[str, dict[str, Any]]], timeout: float = 10
    ) -> dict[int, dict[str, Any]]:
        """Write every `tools/call` (id -> (tool, arguments)) before reading a reply; each id
        must be answered exactly once. Returns the results by id."""
        for ident, (tool, arguments) in calls.items():
            self.send_call(ident, tool, arguments)
        results: dict[int, dict[str, Any]] = {}
        for reply in self.read_replies(len(calls), timeout):
            assert reply["id"] in calls and reply["id"] not in results, reply
            results[reply["id"]] = reply["result"]
        return results

    def close(self) -> int:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def __enter__(self) -> StdioClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call_params(name: str, arguments: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return params
