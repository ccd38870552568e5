"""The face's stdio front, in process on real pipes: the package opens the connection (either era),
then the hot path answers calls and lists; everything else, bad JSON included, is the package's;
a client's cancel of a hot call reaches the bus and the call gets no answer. A real nats-server,
with a bus responder playing the node (tests/runtime/test_face_hot.py)."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
from nats.aio.client import Client

from runtime.meshctl.face.stdio_front import StdioFront, serve_pipes
from tests.unit.runtime.meshctl.test_face_hot import ENVELOPE, LEGACY, MODERN, Node, _call, _face, bus

__all__ = ["bus"]


class Wire:
    """The client's ends of the two pipes: lines out, lines in."""

    def __init__(self, write_fd: int, reader: asyncio.StreamReader) -> None:
        self.write_fd, self.reader = write_fd, reader

    def send(self, message: Any) -> None:
        data = (message if isinstance(message, bytes) else json.dumps(message).encode()) + b"\n"
        os.write(self.write_fd, data)

    async def receive(self) -> dict[str, Any]:
        with anyio.fail_after(10):
            return json.loads(await self.reader.readline())


@asynccontextmanager
async def _stdio(bus: tuple[Client, Node]) -> AsyncIterator[tuple[Wire, StdioFront, Node]]:
    face = _face(bus[0])
    to_face_r, to_face_w = os.pipe()
    from_face_r, from_face_w = os.pipe()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_face_r, "rb", 0)
    )
    fronts: list[StdioFront] = []
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: serve_pipes(face, to_face_r, from_face_w, front=fronts))
                while not fronts:
                    await anyio.sleep(0.01)
                try:
                    yield Wire(to_face_w, reader), fronts[0], bus[1]
                finally:
                    os.close(to_face_w)  # stdin's end: the front and the package's loop end by themselves
    finally:
        transport.close()
        for fd in (to_face_r, from_face_w):
            os.close(fd)


async def _open_legacy(wire: Wire) -> None:
    wire.send(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }
    )
    opened = await wire.receive()
    assert opened["result"]["protocolVersion"] == LEGACY
    wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


async def test_after_initialize_calls_and_lists_are_hot_and_the_rest_the_packages(bus: tuple[Client, Node]) -> None:
    async with _stdio(bus) as (wire, front, _):
        wire.send(_call(1, "m_echo"))  # before the connection is open: the package's (it refuses)
        early = await wire.receive()
        assert early["id"] == 1 and front.served == 0
        await _open_legacy(wire)
        wire.send(_call(2, "m_echo"))
        answer = await wire.receive()
        assert answer == {
            "jsonrpc": "2.0",
            "id": 2,
            "result": {"isError": False, "content": [{"type": "text", "text": "hi"}]},
        }
        wire.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        listed = await wire.receive()
        assert listed["id"] == 3 and "m_echo" in {t["name"] for t in listed["result"]["tools"]}
        assert front.served == 2
        wire.send(b"{not json")  # the package's: it answers nothing (no id to answer) and goes on
        wire.send(b'[{"jsonrpc":"2.0","id":9,"method":"tools/list"}]')  # a batch: the package's too
        wire.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        assert (await wire.receive()) == {"jsonrpc": "2.0", "id": 4, "result": {}}
        wire.send({"jsonrpc": "2.0", "id": 5, "method": "prompts/list"})
        assert (await wire.receive())["error"]["code"] == -32601  # the face serves no prompts: the package says so
        assert front.served == 2


async def test_a_modern_connection_is_opened_by_the_package_then_hot(bus: tuple[Client, Node]) -> None:
    async with _stdio(bus) as (wire, front, _):
        wire.send({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": ENVELOPE}})
        assert "result" in await wire.receive()
        assert front.era.version == MODERN
        wire.send(_call(2, "m_echo", meta=ENVELOPE))
        answer = await wire.receive()
        assert (
            answer["result"]["resultType"] == "complete"
            and "io.modelcontextprotocol/serverInfo" in answer["result"]["_meta"]
        )
        assert front.served == 1
        wire.send(_call(3, "m_echo"))  # no envelope on a modern connection: the package's error
        assert "error" in await wire.receive()
        assert front.served == 1


async def test_a_cancel_reaches_the_bus_and_the_call_is_not_answered(bus: tuple[Client, Node]) -> None:
    async with _stdio(bus) as (wire, front, node):
        await _open_legacy(wire)
        wire.send(_call(7, "m_slow"))
        with anyio.fail_after(10):
            while not node.calls:
                await anyio.sleep(0.01)
        assert 7 in front.running
        wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
        with anyio.fail_after(10):
            while not node.cancels:
                await anyio.sleep(0.01)
        call_id = node.calls[-1].headers["Mesh-Call-Id"] if node.calls[-1].headers else ""
        assert node.cancels == [f"mesh.cancel.{call_id}"]
        wire.send({"jsonrpc": "2.0", "id": 8, "method": "ping"})
        assert (await wire.receive())["id"] == 8  # the next answer is the ping's: the cancelled call got none
        assert front.running == {}
