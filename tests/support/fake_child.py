"""A child in the same process: speaks MCP on the lines a runner writes, exits when its script says.

For the in-process tests of the launcher's state machine and the dispatcher: no fork, no
interpreter start, so a test of restarts, backoff and failure takes milliseconds. The real
child (launcher.process.ChildProcess) has its own end-to-end tests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from launcher import step as step_module
from launcher import supervise as supervise_module
from launcher.bundle import BundleRunner, HealthPolicy, RestartPolicy, RunnerEvents, RunnerSpec
from launcher.process import ChildSpec
from launcher.supervise import Supervised

_pids = itertools.count(40_000)


@dataclass
class Behaviour:
    """What one started child does. Children are started in the order of the script."""

    handshake: bool = True  # answers initialize and tools/list
    exit_after: float | None = None  # exits (with `exit_code`) this long after it started
    exit_code: int = 1
    tools: tuple[str, ...] = ("greet",)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # a tool's inputSchema ({"type": "object"})
    stderr: str = ""  # a line written on stderr before anything else
    unstartable: bool = False  # spawn fails as exec would (no such file)
    exit_on_eof: bool = True  # an MCP child exits when its stdin closes; a service reads nothing
    answer: Callable[[str, dict[str, Any]], Any] | None = None  # tools/call -> result, or None: no answer
    answers_ping: bool = True
    call_seconds: float = 0.0  # a tools/call is answered this long after it arrived
    single_threaded: bool = False  # while a call runs, nothing else is read (pings wait behind it)
    garbage_every: float | None = None  # writes a line that is not JSON-RPC this often
    handshake_after: float = 0.0  # the handshake's answers come this late (a slow start)
    handshake_gate: asyncio.Future[None] | None = None  # ...or only once the test completes this (a start it ends)
    progress: int = 0  # notifications/progress 1..n (with the call's token, if it has one) as a call arrives
    # A tools/call first sends its client this request (e.g. ("elicitation/create", {...})), copying the
    # call's _meta["mesh/call"] unless `ask_ref` is False; the call's result is the text of the response.
    ask: tuple[str, dict[str, Any]] | None = None
    ask_ref: bool = True


def echo(tool: str, arguments: dict[str, Any]) -> Any:
    return {"content": [{"type": "text", "text": f"{tool}: {json.dumps(arguments, sort_keys=True)}"}]}


@dataclass
class Script:
    children: list[Behaviour] = field(default_factory=list)
    default: Behaviour = field(default_factory=lambda: Behaviour(answer=echo))
    started: list[FakeChild] = field(default_factory=list)
    # A node's children, by the bundle ("module/bundle") or else the module they are of (MESH_MODULE,
    # MESH_BUNDLE): each one's starts in order, its last behaviour again for every later start.
    modules: dict[str, list[Behaviour]] = field(default_factory=dict)

    def next(self, spec: ChildSpec | None = None) -> Behaviour:
        env = spec.env if spec is not None else {}
        module = env.get("MESH_MODULE")
        for key in (f"{module}/{env.get('MESH_BUNDLE')}", module):
            if key in self.modules:
                queue = self.modules[key]
                return queue.pop(0) if len(queue) > 1 else queue[0]
        return self.children.pop(0) if self.children else self.default

    def of(self, module: str, bundle: str = "tools") -> list[FakeChild]:
        """The children started for one bundle, oldest first."""
        return [
            c
            for c in self.started
            if c.spec is not None and (c.spec.env.get("MESH_MODULE"), c.spec.env.get("MESH_BUNDLE")) == (module, bundle)
        ]


class FakeChild:
    script: Script
    spec: ChildSpec | None = None  # what the runner asked to start

    def __init__(
        self, behaviour: Behaviour, on_stdout: Callable[[bytes], None], on_stderr: Callable[[bytes], None]
    ) -> None:
        loop = asyncio.get_running_loop()
        self.behaviour = behaviour
        self.pid = next(_pids)
        self.on_stdout, self.on_stderr = on_stdout, on_stderr
        self.exited: asyncio.Future[int] = loop.create_future()
        self.stderr_closed: asyncio.Future[None] = loop.create_future()
        self.stderr_closed.set_result(None)
        self.last_output = loop.time()
        self.broken_reason: str | None = None
        self.confinement = "none: a fake child"
        self.received: list[dict[str, Any]] = []
        self.tools = behaviour.tools  # its own: `change_tools` changes this child's list only
        self._loop = loop
        self._busy_until = 0.0
        self._asking: dict[str, Any] = {}  # its own request's id -> the tools/call waiting for the response
        self.responses: list[dict[str, Any]] = []  # the responses to its own requests
        if behaviour.garbage_every is not None:
            loop.call_later(behaviour.garbage_every, self._garbage)
        if behaviour.stderr:
            on_stderr(behaviour.stderr.encode())
        if behaviour.exit_after is not None:
            loop.call_later(behaviour.exit_after, self.exit, behaviour.exit_code)

    @classmethod
    async def spawn(
        cls, spec: ChildSpec, on_stdout: Callable[[bytes], None], on_stderr: Callable[[bytes], None]
    ) -> FakeChild:
        behaviour = cls.script.next(spec)
        if behaviour.unstartable:
            raise FileNotFoundError(2, "No such file or directory", spec.argv[0])
        child = cls(behaviour, on_stdout, on_stderr)
        child.spec = spec
        cls.script.started.append(child)
        return child

    # --- what the runner and its session call ------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.exited.done():
            raise BrokenPipeError("the child's stdin is closed")
        for line in data.splitlines():
            message = json.loads(line)
            self.received.append(message)
            if "method" not in message and message.get("id") in self._asking:
                self._answered(message)
                continue
            self._schedule(message)

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def close_stdin(self) -> None:
        if self.behaviour.exit_on_eof:
            self.exit(0)

    async def stop(self, grace: float = 2.0, *, ask_first: bool = True) -> int:
        self.exit(0)
        return await self.wait()

    def kill(self) -> None:
        self.exit(-9)

    def close(self) -> None:
        pass

    # --- the child's side ------------------------------------------------------------------------
    def calls(self) -> list[dict[str, Any]]:
        """The tools/call requests it received, in order."""
        return [m for m in self.received if m.get("method") == "tools/call"]

    def cancels(self) -> list[dict[str, Any]]:
        """The params of every notifications/cancelled it received."""
        return [m["params"] for m in self.received if m.get("method") == "notifications/cancelled"]

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        if self.running:
            message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
            if params is not None:
                message["params"] = params
            self.on_stdout(json.dumps(message).encode())

    def change_tools(self, tools: tuple[str, ...]) -> None:
        """Its tool list changes, and it says so (notifications/tools/list_changed)."""
        self.tools = tools
        self.notify("notifications/tools/list_changed")

    def exit(self, status: int) -> None:
        if not self.exited.done():
            self.exited.set_result(status)

    def _reply(self, rid: Any, result: Any) -> None:
        if self.running:
            self.last_output = self._loop.time()
            self.on_stdout(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())

    def _schedule(self, message: dict[str, Any]) -> None:
        b, now = self.behaviour, self._loop.time()
        method = message.get("method")
        delay = 0.0
        if method in ("initialize", "tools/list"):
            delay = b.handshake_after
        elif method == "tools/call":
            delay = b.call_seconds
            if b.progress:
                self._loop.call_soon(self._progress, (message["params"].get("_meta") or {}).get("progressToken"))
        gate = b.handshake_gate
        if method in ("initialize", "tools/list") and gate is not None and not gate.done():
            gate.add_done_callback(lambda _: self._answer(message))
            return
        start = max(now, self._busy_until) if b.single_threaded else now
        if b.single_threaded:
            self._busy_until = start + delay
        self._loop.call_at(start + delay, self._answer, message)

    def _send_ask(self, message: dict[str, Any]) -> None:
        assert self.behaviour.ask is not None
        method, params = self.behaviour.ask
        params = dict(params)
        ref = (message["params"].get("_meta") or {}).get("mesh/call")
        if self.behaviour.ask_ref and ref is not None:
            params["_meta"] = {"mesh/call": ref}
        ask_id = f"ask-{message['id']}"
        self._asking[ask_id] = message["id"]
        self.on_stdout(json.dumps({"jsonrpc": "2.0", "id": ask_id, "method": method, "params": params}).encode())

    def _answered(self, response: dict[str, Any]) -> None:
        rid = self._asking.pop(response["id"])
        self.responses.append(response)
        self._reply(rid, {"content": [{"type": "text", "text": json.dumps(response, sort_keys=True)}]})

    def _progress(self, token: Any) -> None:
        if token is None:
            return  # its caller did not ask: a child sends no progress then
        n = self.behaviour.progress
        for i in range(1, n + 1):
            params = {"progressToken": token, "progress": i, "total": n, "message": f"step {i}"}
            self.notify("notifications/progress", params)

    def _garbage(self) -> None:
        if self.running and self.behaviour.garbage_every is not None:
            self.on_stdout(b"this is not JSON-RPC")
            self._loop.call_later(self.behaviour.garbage_every, self._garbage)

    def _answer(self, message: dict[str, Any]) -> None:
        method, rid = message.get("method"), message.get("id")
        if rid is None:
            return  # a notification
        b = self.behaviour
        if method == "initialize" and b.handshake:
            self._reply(
                rid,
                {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "fake", "version": "0"},
                },
            )
        elif method == "tools/list" and b.handshake:
            schemas = b.schemas
            self._reply(
                rid, {"tools": [{"name": t, "inputSchema": schemas.get(t, {"type": "object"})} for t in self.tools]}
            )
        elif method == "ping" and b.answers_ping:
            self._reply(rid, {})
        elif method == "tools/call" and b.ask is not None:
            self._send_ask(message)
        elif method == "tools/call" and b.answer is not None:
            result = b.answer(message["params"]["name"], message["params"]["arguments"])
            if isinstance(result, Exception):
                self.on_stdout(
                    json.dumps(
                        {"jsonrpc": "2.0", "id": rid, "error": {"code": result.args[0], "message": result.args[1]}}
                    ).encode()
                )
            elif result is not None:
                self._reply(rid, result)


FAST_RESTART = RestartPolicy(
    max_restarts=3, window_s=30, backoff_initial_s=0.02, backoff_max_s=0.05, stable_after_s=0.3
)
FAST_HEALTH = HealthPolicy(init_timeout_s=0.3, ping_interval_s=30, ping_timeout_s=1, ping_misses=2, stop_grace_s=0.1)


def runner_spec(
    timeout_ms: int = 2000,
    max_in_flight: int = 8,
    restart: RestartPolicy = FAST_RESTART,
    health: HealthPolicy = FAST_HEALTH,
    **more: Any,
) -> RunnerSpec:
    child = ChildSpec(argv=["fake"], cwd="/", env={})
    return RunnerSpec(
        module="m",
        name="tools",
        language="python",
        child=child,
        timeout_ms=timeout_ms,
        max_in_flight=max_in_flight,
        restart=restart,
        health=health,
        **more,
    )


class StateRecording(Supervised):
    """Mixed in before a runner class (tools or service): keeps every state it went through, in order."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.states: list[str] = []
        super().__init__(*args, **kw)

    def _set_state(self, state: str) -> None:
        self.states.append(state)
        super()._set_state(state)

    async def reach(self, state: str, timeout: float = 2.0) -> None:
        async with asyncio.timeout(timeout):
            while self.state != state:
                await asyncio.sleep(0.002)


class RecordingRunner(StateRecording, BundleRunner):
    """A tools runner that keeps every state it went through, in order."""


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    """The children the launcher starts in this test, in order; every one is a FakeChild."""
    s = Script()
    monkeypatch.setattr(FakeChild, "script", s, raising=False)
    monkeypatch.setattr(supervise_module, "ChildProcess", FakeChild)  # every supervised child spawns there
    monkeypatch.setattr(step_module, "ChildProcess", FakeChild)  # and every step
    return s


class OnTools(RunnerEvents):
    """A runner's owner that listens to its tool lists only (the dispatcher tests rebuild their routes)."""

    def __init__(self, listener: Callable[[BundleRunner], None]) -> None:
        self.listener = listener

    def tools_changed(self, runner: BundleRunner) -> None:
        self.listener(runner)
