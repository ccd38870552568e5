"""The face's hot path, in process: which messages it takes and which go to the `mcp` package, and
that what it answers is what the package's way answers, byte for byte after JSON decoding, for
both eras. A real nats-server; a bus responder plays the node (it answers `mesh.tool.*` with the
result bytes a test chooses, and records cancels). The HTTP front runs over httpx's ASGI transport
in front of the package's own Streamable HTTP app, so the package's way is the real one."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, cast

import anyio
import httpx2
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from runtime.meshctl.face.catalog import Catalog, Selection
from runtime.meshctl.face.hot import Era, HotCall, HotCancel, HotList
from runtime.meshctl.face.http_front import FaceFront
from runtime.meshctl.face.json_replies import PerRequest
from runtime.meshctl.face.server import Face
from runtime.meshctl.face.transports import http_security
from tests.support.mesh import NatsServer, client

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
}
TOOLS = {
    "echo": {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}},
    "typed": {
        "name": "typed",
        "description": "with an output schema",
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
    "slow": {"name": "slow", "description": "never answers", "inputSchema": {"type": "object"}},
    "tasked": {
        "name": "tasked",
        "description": "may be a task",
        "inputSchema": {"type": "object"},
        "execution": {"taskSupport": "optional"},
    },
    "headed": {
        "name": "headed",
        "description": "names an Mcp-Param header",
        "inputSchema": {"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}},
    },
}


def _info() -> dict[str, Any]:
    endpoints = [
        {
            "subject": f"mesh.tool.m.{name}",
            "metadata": {"mcp_tool": json.dumps(d), "tool": name, "module": "m", "state": "ready"},
        }
        for name, d in TOOLS.items()
    ]
    return {"id": "node-1", "metadata": {"node": "n1"}, "endpoints": endpoints}


class Node:
    """Answers `mesh.tool.m.*` with `result` (bytes) and remembers the cancels it was sent."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.result = b'{"content":[{"type":"text","text":"hi"}]}'
        self.cancels: list[str] = []
        self.calls: list[Msg] = []

    async def start(self) -> None:
        await self.nc.subscribe("mesh.tool.m.*", cb=self._on_call)
        await self.nc.subscribe("mesh.cancel.*", cb=self._on_cancel)

    async def _on_call(self, msg: Msg) -> None:
        self.calls.append(msg)
        if msg.subject != "mesh.tool.m.slow":
            await self.nc.publish(msg.reply, self.result)

    async def _on_cancel(self, msg: Msg) -> None:
        self.cancels.append(msg.subject)


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[tuple[Client, Node]]:
    nc = await client(nats_server.url)
    node_nc = await client(nats_server.url)
    node = Node(node_nc)
    await node.start()
    yield nc, node
    await node_nc.close()
    await nc.close()


def _face(nc: Client) -> Face:
    face = Face(nc, Catalog(Selection()))
    assert face.catalog.rebuild([_info()])
    return face


@asynccontextmanager
async def _http(face: Face) -> AsyncIterator[tuple[FaceFront, httpx2.AsyncClient]]:
    security = http_security("127.0.0.1", [])
    app = face.server.streamable_http_app(
        host="127.0.0.1", transport_security=security, json_response=cast(bool, PerRequest())
    )
    front = FaceFront(app, face, security)
    async with app.router.lifespan_context(app):
        transport = httpx2.ASGITransport(app=front)
        async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as http:
            yield front, http


HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _session(http: httpx2.AsyncClient) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    opened = await http.post("/mcp", json=init, headers=HEADERS)
    assert opened.status_code == 200, opened.text
    headers = {**HEADERS, "Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": LEGACY}
    done = await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert done.status_code == 202
    return headers


def _modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {**HEADERS, "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def _call(rid: int, name: str, arguments: Any = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments if arguments is not None else {"text": "hi"}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


# --- decisions ------------------------------------------------------------------------------
def _body(message: Any) -> bytes:
    return json.dumps(message).encode()


async def test_what_the_hot_path_takes_and_what_goes_to_the_package(bus: tuple[Client, Node]) -> None:
    face = _face(bus[0])
    decide = face.hot.decide
    legacy, modern = (
        Era(LEGACY),
        Era(MODERN, headers={"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "m_echo"}),
    )

    hot = decide(_body(_call(7, "m_echo")), legacy)
    assert isinstance(hot, HotCall) and hot.id == 7 and hot.tool.subject == "mesh.tool.m.echo"
    assert hot.arguments == b'{"text": "hi"}' and hot.version == LEGACY  # the client's bytes, as sent
    assert isinstance(decide(_body(_call(8, "m_echo", meta=ENVELOPE)), modern), HotCall)
    # A client that declares the Tasks extension: a tool that may be a task is the package's (face/task_extension.py).
    tasks = {**ENVELOPE, "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}}}
    tasked = Era(MODERN, headers={"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "m_tasked"})
    assert decide(_body(_call(9, "m_tasked", meta=tasks)), tasked) is None
    assert isinstance(decide(_body(_call(10, "m_tasked", meta=ENVELOPE)), tasked), HotCall)
    assert isinstance(decide(_body(_call(11, "m_echo", meta=tasks)), modern), HotCall)
    listed = decide(b'{"jsonrpc":"2.0","id":"a","method":"tools/list"}', legacy)
    assert isinstance(listed, HotList) and listed.id == "a" and listed.cursor is None
    paged = decide(b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"m_echo"}}', legacy)
    assert isinstance(paged, HotList) and paged.cursor == "m_echo"

    package = [
        (b"not json", legacy),
        (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', legacy),  # a batch
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', legacy),  # a response
        (b'{"jsonrpc":"1.0","id":1,"method":"tools/list"}', legacy),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', legacy),  # an id that is no int or string
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/list","extra":1}', legacy),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', legacy),  # another method
        (b'{"jsonrpc":"2.0","id":1,"method":"resources/list"}', legacy),  # one the face does not serve
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}', legacy),
        (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', legacy),
        (_body(_call(1, "m_echo")), Era(None)),  # nothing known of the connection yet
        (_body(_call(1, "m_echo", meta={"progressToken": 3})), legacy),  # a progress call streams
        (_body({**_call(1, "m_echo"), "params": {"name": "m_echo", "task": {"ttl": 1000}}}), legacy),
        (_body(_call(1, "m_echo", arguments=[1, 2])), legacy),  # arguments that are no object
        (_body(_call(1, "m_echo", arguments="x")), legacy),
        (_body(_call(1, "no_such_tool")), legacy),  # the package's way says which tools there are
        (_body(_call(1, "m_echo", meta={"io.modelcontextprotocol/related-task": {"taskId": "t"}})), legacy),
        (_body(_call(1, "m_echo")), modern),  # no envelope
        (_body(_call(1, "m_echo", meta={**ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2099-01-01"})), modern),
        (
            _body(_call(1, "m_echo", meta=ENVELOPE)),
            Era(MODERN, headers={"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "m_other"}),
        ),
        (
            _body(_call(1, "m_echo", meta=ENVELOPE)),
            Era(MODERN, headers={"mcp-protocol-version": MODERN, "mcp-method": "tools/list"}),
        ),
        (_body(_call(1, "m_echo", meta={**ENVELOPE, "io.modelcontextprotocol/clientInfo": {"name": 5}})), modern),
        (
            _body(_call(1, "m_headed", meta=ENVELOPE)),
            Era(MODERN, headers={"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "m_headed"}),
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
            Era(MODERN, headers={"mcp-protocol-version": MODERN, "mcp-method": "tools/list"}),
        ),
        (b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}', legacy),  # not ours
    ]
    for body, era in package:
        assert decide(body, era) is None, body

    ours = Era(LEGACY, running={4})
    cancel = decide(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}', ours)
    assert cancel == HotCancel(4)
    await bus[0].close()  # the face off the bus: its calls are the package's (an isError saying so)
    assert decide(_body(_call(1, "m_echo")), legacy) is None


# --- answers, against the package's --------------------------------------------------------
RESULTS = [
    b'{"content":[{"type":"text","text":"hi"}]}',
    b'{"content":[{"type":"text","text":"hi"}],"isError":false}',
    b' {"isError":true, "content":[{"type":"text","text":"own failure"}]}',
    b'{"content":[],"structuredContent":{"a":[1,2]},"_meta":{"k":"v"}}',
    b'{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}',
    b'{"content":[{"type":"text","text":"x","annotations":{"priority":0.5}}],"resultType":"complete","extra":1}',
    b'{"content":"no list"}',
    b"not json",
    b'{"content":[{"type":"text","text":"x"}],"structuredContent":[1]}',
    b'{"content":[{"type":"text","text":"x"}],"_meta":null}',
]


async def _both_ways(
    face: Face, http: httpx2.AsyncClient, request: dict[str, Any], headers: dict[str, str]
) -> tuple[Any, Any]:
    face.hot.enabled = True
    hot = await http.post("/mcp", json=request, headers=headers)
    face.hot.enabled = False
    try:
        package = await http.post("/mcp", json=request, headers=headers)
    finally:
        face.hot.enabled = True
    assert hot.status_code == package.status_code == 200, (hot.text, package.text)
    assert hot.headers["content-type"] == package.headers["content-type"] == "application/json"
    assert hot.headers.get("mcp-session-id") == package.headers.get("mcp-session-id")
    return hot.json(), package.json()


async def test_calls_answer_as_the_package_does_in_both_eras(bus: tuple[Client, Node]) -> None:
    nc, node = bus
    face = _face(nc)
    async with _http(face) as (front, http):
        legacy = await _session(http)
        for i, result in enumerate(RESULTS):
            node.result = result
            served = front.served
            hot, package = await _both_ways(face, http, _call(i, "m_echo"), legacy)
            assert front.served == served + 1  # the first went the hot way, the second the package's
            assert hot == package, result
            modern_hot, modern_package = await _both_ways(
                face, http, _call(i, "m_echo", meta=ENVELOPE), _modern_headers("tools/call", "m_echo")
            )
            assert modern_hot == modern_package, result
            assert modern_hot.get("result", {}).get("resultType", "complete") == "complete"
        assert "io.modelcontextprotocol/serverInfo" in modern_hot["result"]["_meta"]
        # The child's text and arguments crossed as they were.
        node.result = b'{"content":[{"type":"text","text":"\\u00e9 \\"q\\""}]}'
        hot, _ = await _both_ways(face, http, _call(99, "m_echo", arguments={"k": "\u00e9"}), legacy)
        assert hot["result"]["content"][0]["text"] == '\u00e9 "q"'
        assert json.loads(node.calls[-1].data) == {"k": "\u00e9"}


async def test_output_schema_is_checked_on_both_ways(bus: tuple[Client, Node]) -> None:
    nc, node = bus
    face = _face(nc)
    async with _http(face) as (_, http):
        legacy = await _session(http)
        node.result = b'{"content":[],"structuredContent":{"n":3}}'
        hot, package = await _both_ways(face, http, _call(1, "m_typed"), legacy)
        assert hot == package and hot["result"]["isError"] is False
        node.result = b'{"content":[],"structuredContent":{"n":"three"}}'
        hot, package = await _both_ways(face, http, _call(2, "m_typed"), legacy)
        assert hot == package and hot["result"]["isError"] is True
        assert (
            "does not match its outputSchema: 'three' is not of type 'integer' (at n)"
            in hot["result"]["content"][0]["text"]
        )


async def test_list_answers_as_the_package_does_and_follows_the_catalog(bus: tuple[Client, Node]) -> None:
    face = _face(bus[0])
    face.page_size = 2
    async with _http(face) as (_, http):
        legacy = await _session(http)
        first, package = await _both_ways(face, http, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, legacy)
        assert first == package and len(first["result"]["tools"]) == 2
        cursor = first["result"]["nextCursor"]
        request = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": cursor}}
        second, package = await _both_ways(face, http, request, legacy)
        assert second == package
        modern = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": ENVELOPE}}
        hot, package = await _both_ways(face, http, modern, _modern_headers("tools/list"))
        assert hot == package and hot["result"]["resultType"] == "complete"
        # A new catalog is a new list at once (the kept pages were of the old one).
        info = _info()
        info["endpoints"] = info["endpoints"][:1]
        assert face.catalog.rebuild([info])
        again, package = await _both_ways(face, http, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, legacy)
        assert again == package and [t["name"] for t in again["result"]["tools"]] == ["m_echo"]


async def test_requests_the_front_leaves_to_the_package(bus: tuple[Client, Node]) -> None:
    face = _face(bus[0])
    async with _http(face) as (front, http):
        legacy = await _session(http)
        served = front.served
        bad = await http.post("/mcp", content=b"{not json", headers=legacy)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == -32700  # the package's parse error
        batch = await http.post("/mcp", content=b"[" + _body(_call(1, "m_echo")) + b"]", headers=legacy)
        assert batch.status_code == 400
        ping = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 5, "method": "ping"}, headers=legacy)
        assert ping.status_code == 200 and "result" in ping.text
        unknown = await http.post("/mcp", json=_call(6, "nope"), headers=legacy)
        assert unknown.json()["result"]["isError"] is True and "no tool named 'nope'" in unknown.text
        no_session = await http.post("/mcp", json=_call(7, "m_echo"), headers={**HEADERS, "Mcp-Session-Id": "f" * 32})
        assert no_session.status_code == 404
        evil = await http.post("/mcp", json=_call(8, "m_echo"), headers={**legacy, "Origin": "http://evil.example"})
        assert evil.status_code == 403
        wrong_type = await http.post(
            "/mcp", content=_body(_call(9, "m_echo")), headers={**legacy, "Content-Type": "text/plain"}
        )
        assert wrong_type.status_code == 400
        mismatch = await http.post(
            "/mcp", json=_call(10, "m_echo", meta=ENVELOPE), headers=_modern_headers("tools/call", "m_other")
        )
        assert mismatch.status_code == 400 and mismatch.json()["error"]["code"] == -32020  # HEADER_MISMATCH
        assert front.served == served  # every one of them was the package's
        discover = await http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 11, "method": "server/discover", "params": {"_meta": ENVELOPE}},
            headers=_modern_headers("server/discover"),
        )
        assert discover.status_code == 200 and "result" in discover.json(), discover.text
        assert "mesh" in discover.text  # the package's discover answer, with the face's name
        # A DELETEd session is gone for the hot path too.
        assert (await http.delete("/mcp", headers=legacy)).status_code == 200
        gone = await http.post("/mcp", json=_call(12, "m_echo"), headers=legacy)
        assert gone.status_code == 404 and front.served == served


async def test_a_legacy_clients_cancel_reaches_a_hot_call(bus: tuple[Client, Node]) -> None:
    nc, node = bus
    face = _face(nc)
    async with _http(face) as (front, http):
        legacy = await _session(http)
        answers: list[Any] = []

        async def slow_call() -> None:
            answers.append((await http.post("/mcp", json=_call(41, "m_slow"), headers=legacy)).json())

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call)
            with anyio.fail_after(10):
                while not node.calls:
                    await anyio.sleep(0.01)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41, "reason": "t"}}
            took = await http.post("/mcp", json=cancel, headers=legacy)
            assert took.status_code == 202
        assert answers == [{"jsonrpc": "2.0", "id": 41, "error": {"code": -32800, "message": "Request cancelled"}}]
        with anyio.fail_after(5):
            while not node.cancels:
                await anyio.sleep(0.01)
        call_id = node.calls[-1].headers["Mesh-Call-Id"] if node.calls[-1].headers else ""
        assert node.cancels == [f"mesh.cancel.{call_id}"]  # the node was told, so the tool is
        assert front._running == {}
