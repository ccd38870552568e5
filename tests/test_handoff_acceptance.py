"""The handoff contract's acceptance (seed 002, issue 13), as two OS processes that know nothing
of each other, each with its own identity, touching only the `handoff` seat.

Agent A (tests/children/handoff_agent.py a) has a task in two halves; half 2 needs the scale
factor that only agent B's calibration file holds. Entry 1: open -> claimed (B found it by
polling) -> resolved, and A's half 2 uses the answer. Entry 2: B cannot answer; one follow-up,
A replies, B blocks; it never reaches the human. The test starts both and then only watches.

Two ways the agents reach the seat, the same two agent processes in both:
- over the bus (`test_two_agents_over_the_bus`): a nats-server with the mesh account and one
  account per agent (runtime/bus/accounts.py writes the block), a real node serving bundles/handoff,
  each agent on its own connection. The server stamps each request with the agent's account and
  user, and the node passes exactly that to the child as `_meta["mesh/caller"]`: the opener and
  the owner in the log are the server's names for the agents. The clocks run here too, with
  limits of seconds and nobody calling (`test_the_clocks_over_the_bus_with_nobody_calling`).
- through a relay (`test_two_agents_through_a_relay`): the test process holds the handoff child
  on stdio, as the node does, and stamps each agent's calls with that agent's identity by the
  pipe it arrives on: the contract without a bus or a node in the way.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from runtime.bus.accounts import accounts_block
from tests.faults.security_support import ConfiguredServer
from tests.support.mesh import FAST_CONFIG, NodeProcess, client, wait_state
from tests.support.sdk import build_context, facts_env, require
from tests.support.stdio_client import StdioClient
from toolchains.go import TOOLCHAIN

REPO = Path(__file__).resolve().parent.parent
MODULE_DIR = REPO / "bundles" / "handoff"
AGENT = REPO / "tests" / "children" / "handoff_agent.py"
NUMBERS = [3, 4, 5, 7]
SCALE_FACTOR = 2.5  # only in B's folder
AGENT_TIMEOUT_S = 90

pytestmark = [pytest.mark.slow, pytest.mark.toolchain("go")]

# The identity of each agent, as the node would stamp it in _meta["mesh/caller"].
A = {"account": "AGENT_A", "user": "a", "name": "handoff-agent-a", "via": "bus"}
B = {"account": "AGENT_B", "user": "b", "name": "handoff-agent-b", "via": "bus"}
WATCHER = {"account": "MESH", "user": "test", "name": None, "via": "local"}


def caller_id(caller: dict[str, Any]) -> str:
    return f"{caller['account']}/{caller['user']}" if caller["user"] else caller["account"]


def workdirs(tmp_path: Path) -> tuple[Path, Path]:
    """A's folder (the task, some notes) and B's (the calibration file A cannot see)."""
    a, b = tmp_path / "agent-a", tmp_path / "agent-b"
    a.mkdir()
    b.mkdir()
    (a / "task.json").write_text(json.dumps({"projekt": "line-7", "numbers": NUMBERS}))
    (a / "notes.txt").write_text("half 2: multiply the sum by the line's calibration factor.\n")
    (b / "calibration.json").write_text(json.dumps({"line": 7, "scale_factor": SCALE_FACTOR}))
    return a, b


def start_agent(role: str, workdir: Path, transport: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), role, "--workdir", str(workdir), *transport],
        cwd=workdir,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_the_seven_points(
    a_dir: Path, b_dir: Path, get: Callable[[str], dict[str, Any]], attention: list[dict[str, Any]]
) -> None:
    """Every point of the seed's acceptance a machine can check, from the agents' folders and
    reports and from the store as the watcher reads it afterwards."""
    ra = json.loads((a_dir / "report.json").read_text())
    rb = json.loads((b_dir / "report.json").read_text())
    assert ra["ok"] and rb["ok"], (ra, rb)
    a_id, b_id = caller_id(A), caller_id(B)

    # 1. A's question is real: nothing A can reach holds the factor, and A looked before asking.
    assert ra["could_answer_alone"] is False
    assert not any(
        "scale_factor" in p.read_text() for p in a_dir.glob("*") if p.name not in ("report.json", "output.txt")
    )
    first, second = get(ra["entry1"]), get(ra["entry2"])
    assert "task.json" in first["versucht"] and "notes.txt" in first["versucht"]

    # 2. B found entry 1 by polling handoff.list, not by a call from A; B became its one owner.
    assert rb["calls"][0] == "list" and rb["calls"].count("list") >= 1
    assert [h["id"] for h in rb["handled"]] == [ra["entry1"], ra["entry2"]]
    assert [(line["who"], line["to"]) for line in first["log"]] == [
        (a_id, "open"),
        (b_id, "claimed"),
        (b_id, "resolved"),
    ]
    assert first["opener"] == a_id and first["owner"] == b_id

    # 3. The answer is in the store, on the entry's id.
    assert first["state"] == "resolved" and str(SCALE_FACTOR) in first["antwort"]

    # 4. Half 2 is done and uses the answer: its figure needs the factor.
    expected = sum(NUMBERS) * SCALE_FACTOR
    assert ra["half1"] == sum(NUMBERS) and ra["half2"] == expected
    assert f"= {expected:g}" in (a_dir / "output.txt").read_text()

    # 5. Entry 2 ends blocked after exactly one follow-up and one reply, and reaches no human.
    assert second["state"] == "blocked" and second["owner"] == b_id and ra["replied"] is True
    assert [(line["who"], line["from"], line["to"]) for line in second["log"]] == [
        (a_id, "", "open"),
        (b_id, "open", "claimed"),
        (b_id, "claimed", "claimed"),
        (a_id, "claimed", "claimed"),
        (b_id, "claimed", "blocked"),
    ]
    assert second["rueckfrage"] and second["rueckfrage_antwort"] and second["grund"]

    # 6. Messages to the human: 0. Nobody escalated; the attention list is empty.
    assert attention == []
    assert "escalate" not in ra["calls"] + rb["calls"]

    # 7. Interventions after the start: 0. Every step in the store is A's or B's; the test only read.
    assert {line["who"] for e in (first, second) for line in e["log"]} == {a_id, b_id}


def run_agents(
    a_dir: Path,
    b_dir: Path,
    a_transport: list[str],
    b_transport: list[str],
    serve: Callable[[subprocess.Popen[str], dict[str, Any]], None] | None = None,
) -> None:
    """Start B (polling) and A, let them run to their end; nothing else happens meanwhile."""
    agent_b = start_agent("b", b_dir, b_transport)
    agent_a = start_agent("a", a_dir, a_transport)
    if serve:
        serve(agent_a, A)
        serve(agent_b, B)
    try:
        for name, proc in (("A", agent_a), ("B", agent_b)):
            proc.wait(AGENT_TIMEOUT_S)
            report = (a_dir if name == "A" else b_dir) / "report.json"
            said = json.loads(report.read_text()).get("error") if report.is_file() else "no report"
            assert proc.returncode == 0, f"agent {name} failed: {said}\n{proc.stderr.read() if proc.stderr else ''}"
    finally:
        for proc in (agent_a, agent_b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# --- through a relay: the test holds the child as the node does -------------------------------
class Relay:
    """The handoff child on stdio with many calls in flight: each agent's line becomes a
    tools/call stamped with that agent's caller, answered on the agent's stdin, as the node stamps
    the caller the server names."""

    def __init__(self, child: StdioClient) -> None:
        self.child = child
        self.lock = threading.Lock()
        self.next_id = 1000
        self.waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        threading.Thread(target=self._replies, daemon=True).start()

    def _replies(self) -> None:
        assert self.child.proc.stdout is not None
        for line in self.child.proc.stdout:
            msg = json.loads(line)
            if "id" in msg and msg["id"] in self.waiting:
                self.waiting.pop(msg["id"]).put(msg.get("result") or {"isError": True, "content": [{"text": str(msg)}]})

    def call(self, caller: dict[str, Any], verb: str, arguments: dict[str, Any]) -> dict[str, Any]:
        answer: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1)
        with self.lock:
            self.next_id += 1
            ident = self.next_id
            self.waiting[ident] = answer
            self.child.send_call(ident, f"handoff.{verb}", arguments, meta={"mesh/caller": caller})
        return answer.get(timeout=AGENT_TIMEOUT_S)

    def serve(self, agent: subprocess.Popen[str], caller: dict[str, Any]) -> None:
        def pump() -> None:
            assert agent.stdout is not None and agent.stdin is not None
            for line in agent.stdout:
                request = json.loads(line)
                result = self.call(caller, request["verb"], request["arguments"])
                agent.stdin.write(json.dumps(result) + "\n")
                agent.stdin.flush()

        threading.Thread(target=pump, daemon=True).start()


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(TOOLCHAIN)
    base = tmp_path_factory.mktemp("handoff-acceptance")
    TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage", base / "cache"))
    return base / "stage"


@pytest.fixture
def relay(stage: Path, tmp_path: Path) -> Iterator[Relay]:
    env = facts_env("handoff", stage, tmp_path / "data")
    child = StdioClient([str(stage / "bin" / "handoff")], cwd=stage, env=env)
    child.initialize()
    yield Relay(child)
    child.close()


def test_two_agents_through_a_relay(relay: Relay, tmp_path: Path) -> None:
    a_dir, b_dir = workdirs(tmp_path)
    run_agents(a_dir, b_dir, ["--relay"], ["--relay"], serve=relay.serve)

    def get(entry_id: str) -> dict[str, Any]:
        return relay.call(WATCHER, "get", {"id": entry_id})["structuredContent"]

    attention = relay.call(WATCHER, "attention", {})["structuredContent"]["entries"]
    assert_the_seven_points(a_dir, b_dir, get, attention)


# --- over the bus: a real nats-server with accounts, a real node -------------------------------
PASSWORD = "handoff-test"


def accounts_server(workdir: Path, agents: dict[str, dict[str, Any]]) -> ConfiguredServer:
    """The mesh account (the node's, user `mesh`) exporting the mesh's services, and one account per
    agent importing them with share: true, so the server stamps every request with the caller's
    account and user. Users of the mesh account may not publish a call (accounts_block denies it)."""
    agent_users = [(c["account"], c["user"], PASSWORD) for c in agents.values()]
    return ConfiguredServer(workdir, accounts_block([("mesh", PASSWORD)], agent_users)).start()


def url_of(server: ConfiguredServer, caller: dict[str, Any]) -> str:
    return f"nats://{caller['user']}:{PASSWORD}@127.0.0.1:{server.port}"


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[ConfiguredServer]:
    server = accounts_server(tmp_path / "nats", {"a": A, "b": B})
    yield server
    server.stop()


def start_node(tmp_path: Path, server: ConfiguredServer, name: str, limits: dict[str, str]) -> NodeProcess:
    config = f'[nats]\nuser = "mesh"\npassword = "{PASSWORD}"\n'
    node = NodeProcess(tmp_path, MODULE_DIR, server.url, name, config=FAST_CONFIG + config, env=limits)
    node.wait_log("serving on", timeout=600)  # the first start builds the bundle (SQLite: a minute cold)

    async def ready() -> None:
        nc = await client(f"nats://mesh:{PASSWORD}@127.0.0.1:{server.port}")
        try:
            await wait_state(nc, name, "handoff/tools", "ready", timeout=600)
        finally:
            await nc.close()

    asyncio.run(ready())
    return node


class BusCaller:
    """One caller's own connection; `call` is a request on mesh.seat.handoff.<verb>."""

    def __init__(self, server: ConfiguredServer, caller: dict[str, Any]) -> None:
        self.url = url_of(server, caller)

    def call(self, verb: str, **arguments: Any) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            nc = await client(self.url)
            try:
                msg = await nc.request(f"mesh.seat.handoff.{verb}", json.dumps(arguments).encode(), timeout=15)
            finally:
                await nc.close()
            assert not (msg.headers and "Nats-Service-Error-Code" in msg.headers), (msg.headers, msg.data)
            return json.loads(msg.data)

        return asyncio.run(go())


def test_the_node_serves_the_seat_to_callers_of_other_accounts(
    tmp_path: Path, bus: ConfiguredServer, stage: Path
) -> None:
    """The bundle built and served by a node, reached from each agent's account through the
    service import."""
    node = start_node(tmp_path, bus, "handoff-node", {})
    try:
        listed = BusCaller(bus, A).call("list")
        assert listed["structuredContent"] == {"entries": []}, listed
        attention = BusCaller(bus, B).call("attention")
        assert attention["structuredContent"] == {"entries": []}
    finally:
        assert node.terminate() == 0


def test_two_agents_over_the_bus(tmp_path: Path, bus: ConfiguredServer, stage: Path) -> None:
    node = start_node(tmp_path, bus, "handoff-node", {})
    try:
        a_dir, b_dir = workdirs(tmp_path)
        run_agents(a_dir, b_dir, ["--bus", url_of(bus, A)], ["--bus", url_of(bus, B)])
        watcher = BusCaller(bus, A)  # reading needs no identity; any caller sees the same store
        attention = watcher.call("attention")["structuredContent"]["entries"]
        assert_the_seven_points(a_dir, b_dir, lambda i: watcher.call("get", id=i)["structuredContent"], attention)
    finally:
        node.terminate()


def test_the_clocks_over_the_bus_with_nobody_calling(tmp_path: Path, bus: ConfiguredServer, stage: Path) -> None:
    """Claim expiry back to open, the second expiry blocked, unanswered blocked: limits of seconds."""
    node = start_node(tmp_path, bus, "handoff-clock", {"HANDOFF_CLAIM_S": "1", "HANDOFF_UNANSWERED_S": "4"})
    try:
        a, b = BusCaller(bus, A), BusCaller(bus, B)
        question = {"projekt": "p", "frage": "f?", "versucht": "v", "benoetigt": "b"}
        held = a.call("open", **question)["structuredContent"]
        quiet = a.call("open", **question)["structuredContent"]
        b.call("claim", id=held["id"])
        started = time.monotonic()
        time.sleep(1.4)
        first = a.call("get", id=held["id"])["structuredContent"]
        assert first["state"] == "open" and first["owner"] == "" and first["log"][-1]["who"] == "handoff"
        b.call("claim", id=held["id"])
        time.sleep(1.4)
        assert a.call("get", id=held["id"])["structuredContent"]["state"] == "blocked"
        time.sleep(max(0.0, 4.4 - (time.monotonic() - started)))
        late = a.call("get", id=quiet["id"])["structuredContent"]
        assert late["state"] == "blocked" and "unanswered" in late["log"][-1]["why"]
        assert a.call("attention")["structuredContent"] == {"entries": []}
    finally:
        node.terminate()
