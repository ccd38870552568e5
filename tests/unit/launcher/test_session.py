"""Session fed lines by hand: ids and futures, errors, timeouts, the child's own requests; the line splitter."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from launcher.errors import CallTimedOut, ChildError, ProtocolError, SessionClosed
from launcher.process import LineTooLong, _Lines
from launcher.session import LATEST_PROTOCOL_VERSION, Session, tool_call_params


class Wire:
    """The child's side of the pipe: what the session wrote, one JSON message a line."""

    def __init__(self) -> None:
        self.lines: list[dict] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            raise BrokenPipeError("closed")
        self.lines += [json.loads(line) for line in data.splitlines()]


def session_with_wire(notifications: list | None = None) -> tuple[Session, Wire]:
    handler = (
        (lambda method, params: notifications.append((method, bytes(params)))) if notifications is not None else None
    )
    session = Session("m/tools", handler)
    wire = Wire()
    session.attach(wire.write)
    return session, wire


def answer(rid: int, result: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()


async def test_a_tool_call_goes_out_as_one_line_and_its_answer_comes_back_raw() -> None:
    session, wire = session_with_wire()
    loop = asyncio.get_running_loop()
    call = session.begin_tool_call(b'"greet"', b'{"name":\n"Ada"}', loop.time() + 1, 1000)
    sent = wire.lines[-1]
    assert sent == {
        "jsonrpc": "2.0",
        "id": call.rid,
        "method": "tools/call",
        "params": {"name": "greet", "arguments": {"name": "Ada"}},
    }
    assert session.in_flight == 1
    session.feed(answer(call.rid, {"content": []}))
    assert msgspec.json.decode(await session.result(call)) == {"content": []}
    assert session.in_flight == 0


def test_tool_call_params_keep_the_arguments_bytes_and_make_one_line() -> None:
    assert tool_call_params(b'"t"', b'{"a":1}') == b',"params":{"name":"t","arguments":{"a":1}}'
    assert b"\n" not in tool_call_params(b'"t"', b'{"a":\n1}')


async def test_answers_in_any_order_reach_their_calls() -> None:
    session, _ = session_with_wire()
    loop = asyncio.get_running_loop()
    calls = [session.begin_tool_call(b'"t"', b"{}", loop.time() + 1, 1000) for _ in range(3)]
    for call in reversed(calls):
        session.feed(answer(call.rid, call.rid))
    assert [int(bytes(await session.result(c))) for c in calls] == [c.rid for c in calls]


async def test_an_error_answer_is_a_child_error_with_its_code() -> None:
    session, _ = session_with_wire()
    call = session.begin_tool_call(b'"t"', b"{}", asyncio.get_running_loop().time() + 1, 1000)
    session.feed(json.dumps({"jsonrpc": "2.0", "id": call.rid, "error": {"code": -32602, "message": "bad n"}}).encode())
    with pytest.raises(ChildError) as e:
        await session.result(call)
    assert (e.value.code, e.value.message) == (-32602, "bad n")


async def test_an_unreadable_answer_naming_its_id_fails_that_call_now() -> None:
    session, _ = session_with_wire()
    call = session.begin_tool_call(b'"t"', b"{}", asyncio.get_running_loop().time() + 60, 60_000)
    session.feed(b'{"jsonrpc":"2.0","id":%d,"result":{"oops"' % call.rid)
    with pytest.raises(ChildError, match="not valid JSON-RPC"):
        await asyncio.wait_for(session.result(call), 1)
    assert session.skipped_lines == 1


async def test_a_late_or_unknown_answer_and_blank_lines_are_ignored() -> None:
    session, _ = session_with_wire()
    session.feed(answer(999, {}))
    session.feed(b"   ")
    assert session.in_flight == 0 and session.skipped_lines == 0


async def test_a_timeout_fails_the_call_and_tells_the_child() -> None:
    session, wire = session_with_wire()
    call = session.begin_tool_call(b'"slow"', b"{}", asyncio.get_running_loop().time() + 0.02, 20)
    with pytest.raises(CallTimedOut) as e:
        await session.result(call)
    assert (e.value.what, e.value.timeout_ms) == ('"slow"', 20)
    assert wire.lines[-1] == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": call.rid, "reason": "timed out after 20 ms"},
    }
    session.feed(answer(call.rid, {}))  # the answer after the timeout goes nowhere
    assert session.in_flight == 0


async def test_the_childs_ping_is_answered_and_other_requests_refused() -> None:
    session, wire = session_with_wire()
    session.feed(b'{"jsonrpc":"2.0","id":"c1","method":"ping"}')
    session.feed(b'{"jsonrpc":"2.0","id":"c2","method":"sampling/createMessage","params":{}}')
    assert wire.lines[0] == {"jsonrpc": "2.0", "id": "c1", "result": {}}
    assert wire.lines[1]["id"] == "c2" and wire.lines[1]["error"]["code"] == -32601
    wire.closed = True
    session.feed(b'{"jsonrpc":"2.0","id":"c3","method":"ping"}')  # the child left: nothing raised


async def test_notifications_reach_the_handler() -> None:
    seen: list = []
    session, _ = session_with_wire(seen)
    session.feed(b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{}}')
    assert seen == [("notifications/tools/list_changed", b"{}")]


async def test_close_fails_every_call_in_flight_and_later_ones() -> None:
    session, _ = session_with_wire()
    loop = asyncio.get_running_loop()
    calls = [session.begin_tool_call(b'"t"', b"{}", loop.time() + 60, 60_000) for _ in range(2)]
    gone = SessionClosed("m/tools", "the child ended")
    session.close(gone)
    for call in calls:
        with pytest.raises(SessionClosed):
            await session.result(call)
    with pytest.raises(SessionClosed):
        session.begin_tool_call(b'"t"', b"{}", loop.time() + 1, 1000)


async def test_a_write_to_a_gone_child_is_session_closed() -> None:
    session, wire = session_with_wire()
    wire.closed = True
    with pytest.raises(SessionClosed, match="cannot write to the child"):
        session.begin_tool_call(b'"t"', b"{}", asyncio.get_running_loop().time() + 1, 1000)
    assert session.in_flight == 0


async def test_the_handshake_checks_the_protocol_revision() -> None:
    session, wire = session_with_wire()
    task = asyncio.get_running_loop().create_task(session.initialize(1))
    await asyncio.sleep(0)
    rid = wire.lines[0]["id"]
    assert wire.lines[0]["params"]["protocolVersion"] == LATEST_PROTOCOL_VERSION
    session.feed(answer(rid, {"protocolVersion": "1999-01-01", "capabilities": {}}))
    with pytest.raises(ProtocolError, match="1999-01-01"):
        await task


# --- the line splitter --------------------------------------------------------------------------
def test_lines_split_whole_pieces_and_joins_a_line_across_reads() -> None:
    got: list[bytes] = []
    lines = _Lines(got.append, limit=100)
    lines.feed(b"one\ntwo\nthr")
    lines.feed(b"ee and")
    lines.feed(b" more\nfour")
    assert got == [b"one", b"two", b"three and more"]
    lines.flush()
    assert got[-1] == b"four"


def test_a_line_over_the_limit_is_refused_and_the_splitter_starts_over() -> None:
    got: list[bytes] = []
    lines = _Lines(got.append, limit=10)
    lines.feed(b"12345")
    with pytest.raises(LineTooLong, match="more than 10 bytes"):
        lines.feed(b"678901")
    lines.feed(b"ok\n")
    assert got == [b"ok"]


# --- the stateless era (2026-07-28) ---------------------------------------------------------------
async def _open_stateless(session: Session, wire: Wire) -> asyncio.Task[None]:
    task = asyncio.get_running_loop().create_task(session.open(1))
    await asyncio.sleep(0)
    init = wire.lines[-1]
    assert init["method"] == "initialize"
    error = {"code": -32022, "message": "2026-07-28 only", "data": {"supported": ["2026-07-28"]}}
    session.feed(json.dumps({"jsonrpc": "2.0", "id": init["id"], "error": error}).encode())
    await asyncio.sleep(0)
    return task


async def test_a_child_that_refuses_initialize_is_asked_server_discover_and_gets_the_envelope() -> None:
    session, wire = session_with_wire()
    task = await _open_stateless(session, wire)
    discover = wire.lines[-1]
    assert discover["method"] == "server/discover"
    assert discover["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    info = {"io.modelcontextprotocol/serverInfo": {"name": "new", "version": "2"}}
    session.feed(answer(discover["id"], {"supportedVersions": ["2026-07-28"], "capabilities": {}, "_meta": info}))
    await task
    assert (session.era, session.protocol_version, session.server_info["name"]) == ("stateless", "2026-07-28", "new")
    assert not any(line.get("method") == "notifications/initialized" for line in wire.lines)
    # Every later request carries the envelope: a tools/call, a listing, the health check.
    loop = asyncio.get_running_loop()
    call = session.begin_tool_call(b'"greet"', b"{}", loop.time() + 1, 1000)
    sent = wire.lines[-1]
    assert sent["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert sent["params"]["name"] == "greet" and sent["params"]["arguments"] == {}
    session.feed(answer(call.rid, {"content": []}))
    await session.result(call)
    ping = loop.create_task(session.ping(1))
    await asyncio.sleep(0)
    assert wire.lines[-1]["method"] == "server/discover"  # no ping in this revision
    assert "io.modelcontextprotocol/clientCapabilities" in wire.lines[-1]["params"]["_meta"]
    session.feed(answer(wire.lines[-1]["id"], {"supportedVersions": ["2026-07-28"]}))
    await ping


async def test_a_child_of_neither_era_is_named_with_both_refusals() -> None:
    session, wire = session_with_wire()
    task = await _open_stateless(session, wire)
    session.feed(
        json.dumps({"jsonrpc": "2.0", "id": wire.lines[-1]["id"], "error": {"code": -32601, "message": "no"}}).encode()
    )
    with pytest.raises(ProtocolError, match="refused both eras"):
        await task


async def test_a_stateless_child_of_another_revision_is_refused_by_name() -> None:
    session, wire = session_with_wire()
    task = await _open_stateless(session, wire)
    session.feed(answer(wire.lines[-1]["id"], {"supportedVersions": ["2099-01-01"]}))
    with pytest.raises(ProtocolError, match="2099-01-01"):
        await task
