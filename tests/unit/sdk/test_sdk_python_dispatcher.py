"""The Python SDK's pipe dispatcher in-process: lines in, handlers called, lines out.

`mesh_sdk.dispatcher.PipeDispatcher` implements the `mcp` library's `Dispatcher` seam for the
node's pipes; these tests feed it lines through a `PipeReader` and read what it writes through
a `PipeWriter`, with plain handlers in place of the library's `ServerRunner` (the end-to-end
tests in test_sdk_python.py run it under the real one).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

SDK = Path(__file__).resolve().parents[3] / "sdk" / "python"
if str(SDK) not in sys.path:
    sys.path.insert(0, str(SDK))

from mcp.shared.exceptions import MCPError  # noqa: E402
from mesh_sdk.dispatcher import PipeDispatcher  # noqa: E402
from mesh_sdk.stdio import PipeReader, PipeWriter, _Drain  # noqa: E402


class _Reading(asyncio.ReadTransport):
    def is_reading(self) -> bool:
        return True


class _Pipe(asyncio.WriteTransport):
    def __init__(self) -> None:
        super().__init__()
        self.lines: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        for line in bytes(data).splitlines():
            self.lines.put_nowait(json.loads(line))


class Wire:
    """The node's side of the pipes: send lines to the dispatcher, read what it answers."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.pipe = _Pipe()
        self.dispatcher = PipeDispatcher(
            PipeReader(self.inbox, _Reading()),
            PipeWriter(self.pipe, _Drain()),
            inline_methods=frozenset({"initialize"}),
        )

    def send(self, message: dict[str, Any] | bytes) -> None:
        self.inbox.put_nowait(message if isinstance(message, bytes) else json.dumps(message).encode())

    def request(self, rid: int, method: str, params: dict[str, Any] | None = None) -> None:
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params else {})})

    async def read(self, timeout: float = 5) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            return await self.pipe.lines.get()

    async def nothing_more(self, wait: float = 0.2) -> None:
        await asyncio.sleep(wait)
        assert self.pipe.lines.empty(), self.pipe.lines.get_nowait()

    def close(self) -> None:
        self.inbox.put_nowait(None)


class _Args(BaseModel):
    n: int


def _handlers(log: list[str]) -> tuple[Any, Any]:
    async def on_request(ctx: Any, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        log.append(method)
        if method == "initialize":
            await anyio.sleep(0.1)
            log.append("initialize done")
        if method == "sleep":
            try:
                await anyio.sleep((params or {})["seconds"])
            except anyio.get_cancelled_exc_class():
                log.append("sleep cancelled")
                raise
        if method == "refuse":
            raise MCPError(code=-32050, message="not today", data={"why": "test"})
        if method == "validate":
            _Args.model_validate(params)
        if method == "crash":
            raise RuntimeError("boom")
        if method == "progress":
            await ctx.progress(1, 2, "half")
        if method == "ask":
            return await ctx.send_raw_request("roots/list", None, {"timeout": (params or {}).get("timeout", 5)})
        return {"method": method, "id": ctx.request_id}

    async def on_notify(ctx: Any, method: str, params: Mapping[str, Any] | None) -> None:
        log.append(f"note {method}")
        if method == "notifications/explode":
            raise RuntimeError("a notification handler that raises")

    return on_request, on_notify


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[Wire, list[str]]]:
    """A dispatcher running on a fresh wire, the handlers' log; stdin closes at the end."""
    wire, log = Wire(), list[str]()
    async with anyio.create_task_group() as tg:
        tg.start_soon(wire.dispatcher.run, *_handlers(log))
        yield wire, log
        wire.close()


async def test_requests_are_answered_by_id_and_a_slow_one_holds_none_up() -> None:
    async with serving() as (wire, log):
        wire.request(1, "sleep", {"seconds": 0.5})
        wire.request(2, "hello")
        wire.send(b"this is not json")  # dropped, as the library's dispatcher drops it
        wire.request(3, "hello")
        first, second = await wire.read(), await wire.read()
        assert [first["id"], second["id"]] == [2, 3]
        assert first == {"jsonrpc": "2.0", "id": 2, "result": {"method": "hello", "id": 2}}
        assert (await wire.read())["id"] == 1


async def test_initialize_is_done_before_the_next_message_is_read() -> None:
    async with serving() as (wire, log):
        wire.request(1, "initialize")
        wire.request(2, "hello")
        assert [(await wire.read())["id"], (await wire.read())["id"]] == [1, 2]
        assert log == ["initialize", "initialize done", "hello"]


async def test_a_cancelled_call_is_never_answered_and_the_others_are() -> None:
    async with serving() as (wire, log):
        wire.request(1, "sleep", {"seconds": 30})
        await asyncio.sleep(0.05)
        wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
        wire.request(2, "hello")
        assert (await wire.read())["id"] == 2
        await wire.nothing_more()
        assert "sleep cancelled" in log  # the handler was stopped, not just left unanswered
        assert "note notifications/cancelled" in log  # still handed to the server, as the library does


async def test_errors_reach_the_node_as_the_library_maps_them() -> None:
    async with serving() as (wire, log):
        wire.request(1, "refuse")
        wire.request(2, "validate", {"n": "not a number"})
        wire.request(3, "crash")
        got = {m["id"]: m["error"] for m in [await wire.read() for _ in range(3)]}
        assert got[1] == {"code": -32050, "message": "not today", "data": {"why": "test"}}
        assert got[2] == {"code": -32602, "message": "Invalid request parameters", "data": ""}
        assert got[3] == {"code": 0, "message": "boom"}


async def test_a_raising_notification_handler_does_not_stop_the_loop() -> None:
    async with serving() as (wire, log):
        wire.send({"jsonrpc": "2.0", "method": "notifications/explode"})
        wire.request(1, "hello")
        assert (await wire.read())["id"] == 1
        assert "note notifications/explode" in log


async def test_calls_still_running_when_stdin_closes_are_answered_connection_closed() -> None:
    with anyio.fail_after(5):  # the end of `serving` closes stdin, and waits for the dispatcher to end
        async with serving() as (wire, _):
            wire.request(1, "sleep", {"seconds": 30})
            wire.request(2, "sleep", {"seconds": 30})
            await asyncio.sleep(0.05)
    got = sorted([await wire.read(), await wire.read()], key=lambda m: m["id"])
    assert [(m["id"], m["error"]) for m in got] == [
        (i, {"code": -32000, "message": "Connection closed"}) for i in (1, 2)
    ]


async def test_progress_goes_out_with_the_callers_token_and_not_without_one() -> None:
    async with serving() as (wire, log):
        wire.request(1, "progress", {"_meta": {"progressToken": "t-1"}})
        assert await wire.read() == {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "t-1", "progress": 1, "total": 2, "message": "half"},
        }
        assert (await wire.read())["id"] == 1
        wire.request(2, "progress")
        assert (await wire.read())["id"] == 2  # the answer, and no progress before it


async def test_a_request_to_the_node_is_matched_to_its_answer_or_times_out() -> None:
    async with serving() as (wire, log):
        wire.request(1, "ask")
        asked = await wire.read()
        assert asked["method"] == "roots/list"
        wire.send({"jsonrpc": "2.0", "id": 999, "result": {"roots": []}})  # an answer to nothing: dropped
        wire.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"roots": [{"uri": "file:///x"}]}})
        assert await wire.read() == {"jsonrpc": "2.0", "id": 1, "result": {"roots": [{"uri": "file:///x"}]}}

        wire.request(2, "ask")
        asked = await wire.read()
        wire.send({"jsonrpc": "2.0", "id": asked["id"], "error": {"code": -32601, "message": "Method not found"}})
        assert (await wire.read())["error"] == {"code": -32601, "message": "Method not found"}

        wire.request(3, "ask", {"timeout": 0.1})
        asked = await wire.read()
        cancel = await wire.read()  # the node never answers: a courtesy cancel, then the timeout error
        assert cancel["method"] == "notifications/cancelled" and cancel["params"]["requestId"] == asked["id"]
        answer = await wire.read()
        assert answer["id"] == 3 and answer["error"]["code"] == -32001  # REQUEST_TIMEOUT
