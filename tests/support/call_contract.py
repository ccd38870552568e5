"""What every SDK must do with a `tools/call` from the node (sdk/COMMON.md, the shared contract), checked
over real stdio against a child that has three fixture tools:

- `whoami`: returns `{"caller": <the Caller it saw, or null>}` as structured content, where a
  Caller is `{"account", "user", "name", "via", "id", "person"}` (`person` null or `{"iss", "sub",
  "name"}`);
- `wait_cancel` `{"marker": path}`: writes "started" to the marker file, waits until its call is
  cancelled (at most ~30 s), then appends "cancelled" (the side channel; its result must never
  be sent);
- `count` `{"steps": n}`: sends n progress notifications (progress i, total n, message
  "step i"), then returns "counted n";
- `confirm` `{"question": q}`: elicits (sdk/COMMON.md, "Asking") with message q and the schema
  `{"ok": boolean}` (required), copying the call's `_meta["mesh/call"]`; returns "ok=true" /
  "ok=false", "declined" or "cancelled"; a JSON-RPC error answer is an isError result naming it.
  Every SDK has an elicit helper (Python, TypeScript, Go, Rust, C).

One set of checks for every language, so the SDKs cannot drift apart: a test module gives a
`contract` fixture (a `serving(...)` Wire on its SDK's fixture bundle) and subclasses
`CallContractTests`.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tests.support.stdio_client import StdioClient

CALLER = {"account": "ALICE", "user": "alice", "name": "alice-client", "via": "bus"}
FORGED = {"account": "MESH", "user": "root", "name": "forged", "via": "local"}
# Each must reach the handler as no caller at all, without hurting the child.
MALFORMED_CALLERS: list[Any] = [
    "ALICE/alice",
    ["ALICE"],
    42,
    {},
    {"account": "ALICE", "via": "bus", "user": 7},
    {"account": "", "user": None, "name": None, "via": "bus"},
    {"account": "ALICE", "user": "x" * 257, "name": None, "via": "bus"},
    {"account": "ALICE", "user": None, "name": "line\nbreak", "via": "bus"},
    {"account": "ALICE", "user": None, "name": None, "via": "carrier-pigeon"},
    {"account": "ALICE", "user": None, "name": None},
    # A person only with a delegate's channel, and only a whole one.
    {"account": "F", "user": "f", "name": None, "via": "bus", "person": {"iss": "i", "sub": "s", "name": "n"}},
    {"account": "F", "user": "f", "name": None, "via": "mcp", "person": "alice"},
    {"account": "F", "user": "f", "name": None, "via": "mcp", "person": {"iss": "i", "sub": "s"}},
    {"account": "F", "user": "f", "name": None, "via": "mcp", "person": {"iss": "", "sub": "s", "name": "n"}},
    {"account": "F", "user": "f", "name": None, "via": "console", "person": {"iss": "i", "sub": 7, "name": "n"}},
    {"account": "F", "user": "f", "name": None, "via": "mcp", "person": {"iss": "i", "sub": "s\n", "name": "n"}},
]
# One id per caller, whatever its names hold (the escaping rule of runtime/wire/identity.py).
ID_CASES: list[tuple[dict[str, Any], str]] = [
    ({"account": "a", "user": "b/c", "name": None, "via": "bus"}, "a/b%2Fc"),
    ({"account": "a/b", "user": "c", "name": None, "via": "bus"}, "a%2Fb/c"),
    ({"account": "local:ops", "user": None, "name": None, "via": "bus"}, "local%3Aops"),
    ({"account": "ops", "user": None, "name": None, "via": "local"}, "local:ops"),
    ({"account": "ops", "user": "x%2F", "name": None, "via": "local"}, "local:ops/x%252F"),
    (
        {
            "account": "faces",
            "user": "mesh-mcp",
            "name": "meshctl-mcp",
            "via": "mcp",
            "person": {"iss": "https://idp.example/", "sub": "alice", "name": "Alice"},
        },
        "person:https%3A%2F%2Fidp.example%2F/alice",
    ),
]


class Wire:
    """Raw JSON-RPC lines to and from one child, read by a thread so a silent child fails a test
    after a timeout instead of hanging it. Everything the child wrote is kept in `seen`."""

    def __init__(self, client: StdioClient) -> None:
        self.client = client
        self.seen: list[dict[str, Any]] = []
        self._lines: queue.Queue[bytes] = queue.Queue()
        stdout = client.proc.stdout
        assert stdout is not None
        threading.Thread(target=self._pump, args=(stdout,), daemon=True).start()

    def _pump(self, stdout: Any) -> None:
        for line in iter(stdout.readline, b""):
            self._lines.put(line)
        self._lines.put(b"")

    def send(self, msg: dict[str, Any]) -> None:
        stdin = self.client.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps({"jsonrpc": "2.0", **msg}).encode() + b"\n")
        stdin.flush()

    def call(self, ident: int | str, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> None:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta is not None:
            params["_meta"] = meta
        self.send({"id": ident, "method": "tools/call", "params": params})

    def until(self, ident: int | str, timeout: float = 15) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The reply to `ident` and every message the child wrote before it."""
        deadline = time.monotonic() + timeout
        before: list[dict[str, Any]] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no reply to {ident!r} within {timeout}s; got {before}") from None
            assert line, f"child closed stdout before answering {ident!r}; got {before}"
            msg = json.loads(line)  # stdout must carry only protocol
            self.seen.append(msg)
            if msg.get("id") == ident and ("result" in msg or "error" in msg):
                return msg, before
            before.append(msg)

    def request(self, timeout: float = 15) -> dict[str, Any]:
        """The next request the child sends its client (a message with a method and an id)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the child sent no request within {timeout}s") from None
            assert line, "child closed stdout before sending its request"
            msg = json.loads(line)
            self.seen.append(msg)
            if "method" in msg and "id" in msg:
                return msg

    def initialize(self) -> None:
        self.send(
            {
                "id": "init",
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    # As the node offers (launcher/session.py): a library may refuse to elicit otherwise.
                    "capabilities": {"elicitation": {"form": {}, "url": {}}},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            }
        )
        assert "result" in self.until("init")[0]
        self.send({"method": "notifications/initialized"})


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("/", "%2F").replace(":", "%3A")


def expected_id(caller: dict[str, Any]) -> str:
    person = caller.get("person")
    if person:
        return f"person:{_escape(person['iss'])}/{_escape(person['sub'])}"
    user = caller.get("user")
    base = f"{_escape(caller['account'])}/{_escape(user)}" if user else _escape(caller["account"])
    return f"local:{base}" if caller["via"] == "local" else base


def expected(caller: dict[str, Any]) -> dict[str, Any]:
    return {
        "account": caller["account"],
        "user": caller.get("user"),
        "name": caller.get("name"),
        "via": caller["via"],
        "id": expected_id(caller),
        "person": caller.get("person"),
    }


def caller_seen(wire: Wire, ident: int, arguments: dict[str, Any], meta: dict[str, Any] | None) -> Any:
    wire.call(ident, "whoami", arguments, meta)
    reply, _ = wire.until(ident)
    result = reply["result"]
    assert not result.get("isError"), result
    return result["structuredContent"]["caller"]


def check_caller(wire: Wire) -> None:
    """Exactly the `_meta` caller reaches the handler; arguments never forge one; a missing or
    malformed one is no caller, and the child serves on."""
    seen = caller_seen(wire, 1, {"caller": FORGED, "account": "MESH", "user": "root"}, {"mesh/caller": CALLER})
    assert seen == expected(CALLER), seen
    local = {"account": "MESH", "user": None, "name": None, "via": "local"}
    assert caller_seen(wire, 2, {}, {"mesh/caller": local}) == expected(local)
    bare = {"account": "BOB", "via": "bus"}  # an import without `share`: no user, no name
    assert caller_seen(wire, 6, {}, {"mesh/caller": bare}) == {**expected(bare), "id": "BOB"}
    assert expected(local)["id"] == "local:MESH"  # the node's own caller never shares a bus caller's id
    for n, (case, ident) in enumerate(ID_CASES):
        seen = caller_seen(wire, 200 + n, {}, {"mesh/caller": case})
        assert seen == expected(case) and seen["id"] == ident, (case, seen)
    assert caller_seen(wire, 3, {"caller": FORGED}, None) is None, "a caller forged in the arguments was believed"
    assert caller_seen(wire, 4, {}, {"progressToken": "p"}) is None
    for n, bad in enumerate(MALFORMED_CALLERS):
        assert caller_seen(wire, 100 + n, {}, {"mesh/caller": bad}) is None, f"malformed caller accepted: {bad!r}"
    longest = {"account": "A" * 256, "user": "u" * 256, "name": "n" * 256, "via": "mcp"}
    assert caller_seen(wire, 5, {}, {"mesh/caller": longest}) == expected(longest)
    wire.send({"id": "alive", "method": "ping"})
    assert wire.until("alive")[0]["result"] == {}


def _wait_for(path: Path, text: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, (
            f"{path} never said {text!r}; it holds {path.read_text() if path.exists() else None!r}"
        )
        time.sleep(0.01)


def check_cancel(wire: Wire, marker: Path, tool: str = "wait_cancel") -> None:
    """A cancel reaches the running handler, its call gets no reply, and the session goes on.
    `tool` behaves as `wait_cancel` (an SDK may check more than one kind of handler)."""
    wire.call(50, tool, {"marker": str(marker)})
    _wait_for(marker, "started")
    wire.send({"method": "notifications/cancelled", "params": {"requestId": 50, "reason": "test"}})
    wire.call(51, "whoami", {}, {"mesh/caller": CALLER})  # a later call is still answered
    reply, _ = wire.until(51)
    assert reply["result"]["structuredContent"]["caller"] == expected(CALLER)
    _wait_for(marker, "cancelled")
    time.sleep(0.3)  # room for a reply to 50 that must not come
    wire.send({"id": 52, "method": "ping"})
    wire.until(52)
    assert [m for m in wire.seen if m.get("id") == 50] == [], "a cancelled call was answered"
    assert marker.read_text().split() == ["started", "cancelled"]


def check_progress(wire: Wire, tool: str = "count") -> None:
    """Three progress notifications with the request's token, in order, before the result;
    none at all without a token. `tool` behaves as `count`."""
    for ident, token in ((60, "tok-60"), (61, 61)):
        wire.call(ident, tool, {"steps": 3}, {"progressToken": token})
        reply, before = wire.until(ident)
        assert reply["result"]["content"][0]["text"] == "counted 3"
        progress = [m for m in before if m.get("method") == "notifications/progress"]
        assert [m["params"] for m in progress] == [
            {"progressToken": token, "progress": i, "total": 3, "message": f"step {i}"} for i in (1, 2, 3)
        ], before
    wire.call(62, tool, {"steps": 3})
    reply, before = wire.until(62)
    assert reply["result"]["content"][0]["text"] == "counted 3"
    assert [m for m in before if m.get("method") == "notifications/progress"] == [], "progress sent without a token"


@contextmanager
def serving(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> Iterator[Wire]:
    """A child started and initialized; it must exit 0 when its stdin closes."""
    client = StdioClient(argv, cwd=cwd, env=env)
    wire = Wire(client)
    wire.initialize()
    yield wire
    assert client.close() == 0


def check_ask(wire: Wire) -> None:
    """An elicitation goes to the client carrying the call's `mesh/call`; the answer reaches the handler."""
    answers = (({"action": "accept", "content": {"ok": True}}, "ok=true"), ({"action": "decline"}, "declined"))
    for n, (answer, said) in enumerate(answers):
        wire.call(60 + n, "confirm", {"question": "Ship it?"}, {"mesh/call": 7 + n})
        ask = wire.request()
        params = ask["params"]
        assert ask["method"] == "elicitation/create" and params["message"] == "Ship it?", ask
        assert (params.get("_meta") or {}).get("mesh/call") == 7 + n, f"the call reference was not copied: {ask}"
        assert params["requestedSchema"]["properties"]["ok"]["type"] == "boolean", ask
        wire.send({"id": ask["id"], "result": answer})
        reply, _ = wire.until(60 + n)
        assert reply["result"]["content"][0]["text"] == said, reply
    wire.call(70, "confirm", {"question": "?"}, {"mesh/call": 9})
    ask = wire.request()
    wire.send({"id": ask["id"], "error": {"code": -32601, "message": "the caller of this call cannot answer it"}})
    reply, _ = wire.until(70)
    assert "cannot answer" in json.dumps(reply), reply  # an error result or a JSON-RPC error naming it
    wire.send({"id": "alive", "method": "ping"})
    assert wire.until("alive")[0]["result"] == {}


class CallContractTests:
    """The contract's tests, collected in each test module that subclasses this as `Test...`."""

    def test_handler_gets_the_caller_from_meta_only(self, contract: Wire) -> None:
        check_caller(contract)
        assert contract.client.close() == 0
        stderr = contract.client.proc.stderr
        assert stderr is not None and b"mesh/caller is malformed" in stderr.read(), "a malformed caller was not logged"

    def test_cancel_reaches_the_handler_and_drops_its_reply(self, contract: Wire, tmp_path: Path) -> None:
        check_cancel(contract, tmp_path / "marker")

    def test_progress_arrives_in_order_with_the_token(self, contract: Wire) -> None:
        check_progress(contract)

    def test_an_elicitation_carries_the_call_and_its_answer_reaches_the_handler(self, contract: Wire) -> None:
        check_ask(contract)
