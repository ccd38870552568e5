"""Issue 9 at the bus's edge, in-process: what a caller is answered when the slots are full (item 3),
where a 504's time went (item 12), calls during an operator restart (item 15), and a seat verb of a
seat the module does not declare (item 18)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator

import pytest
from nats.aio.msg import Msg

from runtime.calls.routes import ModuleEntry, RouteTable
from runtime.wire.errors import HEADER_CODE
from tests.support.fake_child import Behaviour, OnTools, RecordingRunner, Script, echo, runner_spec
from tests.unit.runtime.calls.test_dispatch import Bus, Mesh


def _mesh(**spec: Any) -> Mesh:
    bus, table = Bus(), RouteTable("node-a")
    runner = RecordingRunner(runner_spec(**spec), events=OnTools(lambda r: table.rebuild()))
    table.modules["m"] = ModuleEntry("m", "1.0.0", [runner])
    return Mesh(bus, table, runner)


@pytest.fixture
async def meshes(script: Script) -> AsyncIterator[list[Mesh]]:
    made: list[Mesh] = []
    yield made
    for mesh in made:
        await mesh.runner.stop()
        if mesh.task is not None:
            await asyncio.wait_for(mesh.task, 2)


def send(mesh: Mesh, n: int, body: bytes = b"{}", subject: str = "mesh.tool.m.greet") -> str:
    reply = f"_INBOX.h{n}"
    mesh.dispatcher.start(Msg(None, subject=subject, reply=reply, data=body))  # type: ignore[arg-type]
    return reply


async def answer(mesh: Mesh, reply: str, timeout: float = 3) -> tuple[Any, str | None]:
    async with asyncio.timeout(timeout):
        while reply not in mesh.bus.replies:
            mesh.bus.answered.clear()
            await mesh.bus.answered.wait()
    data, headers = mesh.bus.replies[reply]
    return json.loads(data), (headers or {}).get(HEADER_CODE)


# --- item 3 -------------------------------------------------------------------------------------
async def test_item3_a_call_that_finds_the_queue_full_is_503_overloaded_at_once(
    meshes: list[Mesh], script: Script
) -> None:
    script.default = Behaviour(answer=echo, call_seconds=0.5)
    mesh = _mesh(timeout_ms=3000, max_in_flight=1, max_waiting=2)
    meshes.append(mesh)
    await mesh.ready()
    loop = asyncio.get_running_loop()
    replies = [send(mesh, i) for i in range(4)]  # 1 in flight, 2 waiting, 1 too many
    began = loop.time()
    error, code = await answer(mesh, replies[3])
    assert loop.time() - began < 0.1, "an overloaded call must be answered at once"
    assert code == "503" and error["error"]["kind"] == "overloaded", error
    e = error["error"]
    assert (e["bundle"], e["in_flight"], e["limit"], e["waiting"]) == ("m/tools", 1, 1, 2)
    assert "m/tools" in e["message"] and "1 in flight of 1" in e["message"]
    for reply in replies[:3]:
        result, code = await answer(mesh, reply)
        assert code is None, result


# --- item 12 ------------------------------------------------------------------------------------
async def _call_during_start(meshes: list[Mesh], timeout_ms: int) -> tuple[Any, str | None, float]:
    """A call sent the moment the runner starts: its reply, its code, and how long it took."""
    mesh = _mesh(timeout_ms=timeout_ms)
    meshes.append(mesh)
    mesh.start()
    loop = asyncio.get_running_loop()
    began = loop.time()
    error, code = await answer(mesh, send(mesh, 1))
    return error, code, loop.time() - began


async def test_item12_time_spent_waiting_for_a_start_is_504_at_the_deadline_saying_so(
    meshes: list[Mesh], script: Script
) -> None:
    script.default = Behaviour(answer=echo, handshake_after=0.25)  # a start longer than the timeout
    error, code, waited = await _call_during_start(meshes, 150)
    assert code == "504", error
    assert error["error"]["waited_for"] == "start" and "start" in error["error"]["message"]
    assert 0.14 <= waited < 0.25, f"answered after {waited:.3f} s for a 150 ms timeout"


async def test_item12_a_start_then_the_child_share_one_deadline(meshes: list[Mesh], script: Script) -> None:
    # 0.2 s of start, then a call that takes 0.2 s: 0.4 s in all, past the 0.3 s set at arrival.
    script.default = Behaviour(answer=echo, handshake_after=0.1, call_seconds=0.2)
    error, code, waited = await _call_during_start(meshes, 300)
    assert code == "504" and error["error"]["waited_for"] == "child", error
    assert 0.28 <= waited < 0.45, f"answered after {waited:.3f} s for a 300 ms timeout"


async def test_item12_time_spent_waiting_for_a_slot_is_504_saying_so(meshes: list[Mesh], script: Script) -> None:
    script.default = Behaviour(answer=echo, call_seconds=1.0)
    mesh = _mesh(timeout_ms=300, max_in_flight=1)
    meshes.append(mesh)
    await mesh.ready()
    # The slot is held by a call with a later deadline (begun by hand), for the waiter's whole 0.3 s.
    holder = mesh.runner.begin(b'"greet"', b"{}", asyncio.get_running_loop().time() + 5)
    assert holder is not None
    error, code = await answer(mesh, send(mesh, 2))
    assert code == "504" and error["error"]["waited_for"] == "slot", error
    assert "slot" in error["error"]["message"] and "never reached the child" in error["error"]["message"]
    await mesh.runner.finish(holder)
    error, code = await answer(mesh, send(mesh, 3))
    assert code == "504" and error["error"]["waited_for"] == "child", error


# --- item 15 ------------------------------------------------------------------------------------
async def test_item15_a_call_during_an_operator_restart_rides_over_it(meshes: list[Mesh], script: Script) -> None:
    script.default = Behaviour(answer=echo, handshake_after=0.05)
    mesh = _mesh(timeout_ms=2000)
    meshes.append(mesh)
    await mesh.ready()
    mesh.runner.request_restart()
    assert mesh.runner.status().state == "restarting"
    result, code = await answer(mesh, send(mesh, 1, b'{"during":"restart"}'))
    assert code is None and "during" in result["content"][0]["text"], result
    assert len(script.started) == 2


# --- item 18 ------------------------------------------------------------------------------------
async def test_item18_a_seat_verb_of_an_undeclared_seat_is_an_error_naming_tool_and_seat(
    meshes: list[Mesh], script: Script, caplog: pytest.LogCaptureFixture
) -> None:
    script.default = Behaviour(answer=echo, tools=("greet", "memo.put", "echo.say"))
    bus, table = Bus(), RouteTable("node-a")
    runner = RecordingRunner(runner_spec(), events=OnTools(lambda r: table.rebuild()))
    # The module declares seat "echo" (not held on this node) and no seat "memo".
    table.modules["m"] = ModuleEntry("m", "1.0.0", [runner], declared_seats=["echo"])
    mesh = Mesh(bus, table, runner)
    meshes.append(mesh)
    caplog.set_level(logging.ERROR)
    await mesh.ready()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert "memo.put" in errors[0] and "[[seat]]" in errors[0] and 'name = "memo"' in errors[0]
    # Listed again (tools changed): said once, not on every rebuild.
    table.rebuild()
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    error, code = await answer(mesh, send(mesh, 1, subject="mesh.tool.m.memo.put"))
    assert code == "404", error
    assert any("[[seat]]" in w for w in error["error"]["ways_out"]), error
    assert table.problems() == [errors[0]]
    # A version that declares the seat has no such problem any more.
    table.modules["m"].declared_seats = ["echo", "memo"]
    table.rebuild()
    assert table.problems() == []


def test_item18_declared_seats_default_to_no_check() -> None:
    table = RouteTable("node-a")
    assert ModuleEntry("m", "1", []).declared_seats is None
    assert table.problems() == []
