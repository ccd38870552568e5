"""The dispatcher over a route table of fake-child runners: every answer a caller can get, in-process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.msg import Msg

from runtime.calls.dispatch import Dispatcher
from runtime.calls.identity import CallerStamp
from runtime.calls.routes import ModuleEntry, RouteTable
from runtime.wire.errors import HEADER_CODE
from tests.support.fake_child import Behaviour, OnTools, RecordingRunner, Script, runner_spec


class Bus:
    """What the dispatcher needs of a NATS client: publish, and the server's max payload."""

    def __init__(self, max_payload: int = 1024 * 1024) -> None:
        self.max_payload = max_payload
        self.replies: dict[str, tuple[bytes, dict[str, str] | None]] = {}
        self.answered = asyncio.Event()

    async def publish(self, subject: str, payload: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.replies[subject] = (payload, headers)
        self.answered.set()


class Mesh:
    def __init__(self, bus: Bus, table: RouteTable, runner: RecordingRunner, stamp: CallerStamp | None = None) -> None:
        self.bus, self.table, self.runner = bus, table, runner
        self.dispatcher = Dispatcher(bus, table, "node-a", stamp=stamp)  # type: ignore[arg-type]
        self._n = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the runner: its first child does what the script says by now."""
        self.task = asyncio.get_running_loop().create_task(self.runner.run())

    async def ready(self) -> None:
        self.start()
        await self.runner.reach("ready")

    async def ask(
        self, subject: str, body: bytes = b"{}", headers: dict[str, str] | None = None
    ) -> tuple[Any, str | None]:
        """One request; its reply's JSON body and its error code (None: a result)."""
        self._n += 1
        reply = f"_INBOX.{self._n}"
        msg = Msg(None, subject=subject, reply=reply, data=body, headers=headers)  # type: ignore[arg-type]
        self.dispatcher.start(msg)
        async with asyncio.timeout(3):
            while reply not in self.bus.replies:
                self.bus.answered.clear()
                await self.bus.answered.wait()
        data, headers = self.bus.replies[reply]
        return json.loads(data), (headers or {}).get(HEADER_CODE)


def new_mesh(timeout_ms: int = 300, stamp: CallerStamp | None = None) -> Mesh:
    """Module m with one fake-child runner, not started, and a dispatcher over it."""
    table = RouteTable("node-a")
    runner = RecordingRunner(runner_spec(timeout_ms=timeout_ms), events=OnTools(lambda r: table.rebuild()))
    table.modules["m"] = ModuleEntry("m", "1.0.0", [runner])
    return Mesh(Bus(), table, runner, stamp)


async def end(mesh: Mesh) -> None:
    await mesh.runner.stop()
    if mesh.task is not None:
        await asyncio.wait_for(mesh.task, 2)


@pytest.fixture
async def mesh(script: Script):
    mesh = new_mesh()
    yield mesh
    await end(mesh)


async def test_a_call_to_a_ready_bundle_is_answered_with_the_childs_result(mesh: Mesh) -> None:
    await mesh.ready()
    result, code = await mesh.ask("mesh.tool.m.greet", b'{"name":"Ada"}')
    assert code is None and result["content"][0]["text"] == 'greet: {"name": "Ada"}'
    route = mesh.table.routes["mesh.tool.m.greet"]
    assert (route.stats.num_requests, route.stats.num_errors) == (1, 0)
    assert (mesh.dispatcher.answered, mesh.dispatcher.in_flight) == (1, 0)


async def test_a_call_that_arrives_while_the_bundle_starts_waits_for_it(mesh: Mesh) -> None:
    mesh.start()
    assert mesh.runner.state == "starting" and not mesh.table.routes
    result, code = await mesh.ask("mesh.tool.m.greet")
    assert code is None and "greet" in result["content"][0]["text"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[1]", "must be a JSON object"),
        (b"{nope", "not valid JSON"),
        (b'{"a":"\xff"}', "not UTF-8"),
    ],
)
async def test_a_bad_body_is_400_and_never_reaches_the_child(
    mesh: Mesh, script: Script, body: bytes, says: str
) -> None:
    await mesh.ready()
    sent_before = len(script.started[-1].received)
    error, code = await mesh.ask("mesh.tool.m.greet", body)
    assert code == "400" and says in error["error"]["message"]
    assert len(script.started[-1].received) == sent_before
    assert mesh.table.routes["mesh.tool.m.greet"].stats.num_errors == 1


async def test_an_unknown_tool_or_module_is_404_naming_what_is_there(mesh: Mesh) -> None:
    await mesh.ready()
    error, code = await mesh.ask("mesh.tool.m.nope")
    assert code == "404" and "module m has no tool 'nope'" in error["error"]["message"]
    error, code = await mesh.ask("mesh.tool.other.greet")
    assert code == "404" and "module 'other' is not served by node node-a" in error["error"]["message"]


async def test_a_failed_bundle_is_503_at_once(mesh: Mesh, script: Script) -> None:
    await mesh.ready()
    script.default = Behaviour(exit_after=0.0)
    script.started[-1].exit(1)
    await mesh.runner.reach("failed")
    error, code = await mesh.ask("mesh.tool.m.greet")
    assert code == "503" and "is failed" in error["error"]["message"]


async def test_a_child_that_does_not_answer_is_504_within_the_deadline(mesh: Mesh, script: Script) -> None:
    script.default = Behaviour(answer=lambda tool, args: None)
    await mesh.ready()
    loop = asyncio.get_running_loop()
    began = loop.time()
    error, code = await mesh.ask("mesh.tool.m.greet")
    assert code == "504" and "did not answer within 300 ms" in error["error"]["message"]
    assert loop.time() - began < 1


async def test_the_childs_json_rpc_errors_become_the_callers_errors(mesh: Mesh, script: Script) -> None:
    script.default = Behaviour(answer=lambda tool, args: ValueError(-32602, "name is required"))
    await mesh.ready()
    error, code = await mesh.ask("mesh.tool.m.greet")
    assert code == "400" and "the tool refused its arguments: name is required" in error["error"]["message"]


async def test_a_result_over_the_bus_limit_is_413(mesh: Mesh, script: Script) -> None:
    script.default = Behaviour(answer=lambda tool, args: {"content": [{"type": "text", "text": "x" * 2000}]})
    mesh.bus.max_payload = 1000
    await mesh.ready()
    error, code = await mesh.ask("mesh.tool.m.greet")
    assert code == "413"


async def test_cancel_all_answers_what_is_in_flight_node_stopping(mesh: Mesh, script: Script) -> None:
    script.default = Behaviour(answer=lambda tool, args: None)
    await mesh.ready()
    mesh.dispatcher.start(Msg(None, subject="mesh.tool.m.greet", reply="_INBOX.stop", data=b"{}"))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert mesh.dispatcher.in_flight == 1
    await mesh.dispatcher.cancel_all()
    data, headers = mesh.bus.replies["_INBOX.stop"]
    assert headers is not None and headers[HEADER_CODE] == "503" and b"stopped before the call finished" in data
    assert mesh.dispatcher.in_flight == 0
    await asyncio.wait_for(mesh.dispatcher.wait_idle(), 1)
