"""The bus call protocol end to end (docs/bus.md): a real nats-server, a real node, the raw child.

Deadline, cancel (and the cancels that must do nothing), progress in order, keepalives, a 10 MB
result through the object store and gone after its TTL, a request larger than a message, bad
headers, and `meshctl call` showing progress and cancelling on SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import anyio
import nats
import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from runtime.client import MeshClient, NodeRefused, NodeSilent, NoResponders, tool_result
from runtime.wire.callproto import CALL_ID, FRAME, PROGRESS, REQUEST_OBJECT, RESULT_OBJECT, TIMEOUT_MS, ProgressFrame
from runtime.wire.subjects import cancel_subject
from tests.support.mesh import (
    FAST_CONFIG,
    MESHCTL,
    ROOT,
    NatsServer,
    NodeProcess,
    client,
    make_module,
    stop_process,
    wait_state,
)
from tests.support.mesh import (
    status as nc_status,
)

KEEPALIVE_S = 0.3
TTL_S = 3
CAP = 12_000_000
CONFIG = (
    FAST_CONFIG
    + f"""
[calls]
keepalive_s = {KEEPALIVE_S}
object_ttl_s = {TTL_S}
object_cap_bytes = {CAP}
"""
)
HOLD = "mesh.tool.calls.hold"


@dataclass
class Mesh:
    url: str
    node: NodeProcess
    call_log: Path

    def events(self) -> list[tuple[float, str, str, str]]:
        """(time, event, request id, rest) per line the child logged."""
        if not self.call_log.exists():
            return []
        out = []
        for line in self.call_log.read_text().splitlines():
            t, event, rid, *rest = line.split(" ", 3)
            out.append((float(t), event, rid, rest[0] if rest else ""))
        return out

    async def started(self, tag: str, timeout: float = 10) -> str:
        """The request id of the hold call tagged `tag`, once the child has it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, event, rid, rest in self.events():
                if event == "started" and rest == tag:
                    return rid
            await asyncio.sleep(0.01)
        raise AssertionError(f"the child never started hold {tag}: {self.events()}")

    def cancelled(self, rid: str) -> list[tuple[float, str]]:
        return [(t, rest) for t, event, r, rest in self.events() if event == "cancelled" and r == rid]

    async def wait_cancelled(self, rid: str, timeout: float = 3) -> list[tuple[float, str]]:
        """The child's cancel lines for `rid`, once there is one (or [] after `timeout`)."""
        deadline = time.monotonic() + timeout
        while not self.cancelled(rid) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return self.cancelled(rid)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    work = tmp_path_factory.mktemp("calls")
    server = NatsServer(work / "nats").start()  # its own: the TTL of the calls bucket is this test's
    log = work / "calls.log"
    make_module(work / "modules", "calls", env={"RAW_CALL_LOG": str(log)}, timeout_ms=5000)
    node = NodeProcess(work, work / "modules", server.url, "calls-node", config=CONFIG)
    try:
        node.wait_log("serving on")
        yield Mesh(server.url, node, log)
    finally:
        node.kill()
        server.stop()


async def ready(mesh: Mesh) -> nats.NATS:
    nc = await client(mesh.url)
    await wait_state(nc, mesh.node.name, "calls/tools", "ready")
    return nc


async def raw(nc: nats.NATS, subject: str, body: bytes, headers: dict[str, str], wait: float = 5) -> list:
    """Every message that comes back on a fresh inbox within `wait` s, or until a final one."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, body, reply=inbox, headers=headers)
    got = []
    with anyio.move_on_after(wait):
        async for msg in sub.messages:
            got.append(msg)
            if not (msg.headers and FRAME in msg.headers):
                break
    await sub.unsubscribe()
    return got


def error_of(msg) -> tuple[int, dict]:
    return int(msg.headers["Nats-Service-Error-Code"]), json.loads(msg.data)


async def test_caller_deadline_shortens_the_bundle_timeout_never_lengthens_it(mesh: Mesh) -> None:
    nc = await ready(mesh)
    t = time.monotonic()
    [msg] = await raw(nc, HOLD, b'{"seconds": 3, "tag": "deadline"}', {TIMEOUT_MS: "300"})
    took = time.monotonic() - t
    code, body = error_of(msg)
    assert code == 504 and body["error"]["deadline"] == "caller" and body["error"]["timeout_ms"] == 300
    assert "caller's deadline" in body["error"]["message"]
    rid = await mesh.started("deadline")
    assert await mesh.wait_cancelled(rid), "the child was not told its call timed out"
    assert took < 2.5, f"answered after {took:.2f} s, not at the caller's 300 ms"
    print(f"deadline 300 ms answered 504 after {took * 1000:.0f} ms")
    # Longer than the bundle's 5000 ms: the bundle's cap holds.
    [msg] = await raw(nc, HOLD, b'{"seconds": 8, "tag": "cap"}', {TIMEOUT_MS: "60000"}, wait=10)
    code, body = error_of(msg)
    assert code == 504 and body["error"]["deadline"] == "bundle" and body["error"]["timeout_ms"] == 5000
    await nc.close()


async def test_cancel_reaches_the_child_and_nothing_more_is_answered(mesh: Mesh) -> None:
    nc = await ready(mesh)
    call_id = "cancel-test-0123456789ab"
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(HOLD, b'{"seconds": 4, "tag": "cancel"}', reply=inbox, headers={CALL_ID: call_id})
    rid = await mesh.started("cancel")
    sent = time.time()
    await nc.publish(cancel_subject(call_id), b'{"reason": "user pressed stop"}')
    await nc.flush()
    [(at, reason)] = await mesh.wait_cancelled(rid)
    print(f"cancel reached the child {1000 * (at - sent):.1f} ms after it was published")
    assert at - sent < 2, "the cancel did not reach the child promptly (the call's own timeout is 5 s)"
    assert reason == "user pressed stop"
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=1.0)  # no answer for a cancelled call, not even an error
    await sub.unsubscribe()
    # The node serves on, and knows the call is over.
    code = await tool_code(nc, "mesh.tool.calls.echo")
    assert code == 200
    await nc.close()


async def tool_code(nc: nats.NATS, subject: str) -> int:
    msg = await nc.request(subject, b"{}", timeout=5)
    return (
        int(msg.headers["Nats-Service-Error-Code"]) if msg.headers and "Nats-Service-Error-Code" in msg.headers else 200
    )


async def test_cancel_of_an_answered_call_does_nothing(mesh: Mesh) -> None:
    nc = await ready(mesh)
    call_id = "answered-0123456789abcd"
    [msg] = await raw(nc, HOLD, b'{"seconds": 0.05, "tag": "answered"}', {CALL_ID: call_id})
    assert json.loads(msg.data)["content"][0]["text"] == "held"
    rid = await mesh.started("answered")
    before = len(mesh.events())
    await nc.publish(cancel_subject(call_id), b"")
    await nc.flush()
    await asyncio.sleep(0.3)
    assert not mesh.cancelled(rid) and len(mesh.events()) == before
    # The node serves the next call as before (ids are used once: docs/bus.md).
    [msg] = await raw(nc, "mesh.tool.calls.echo", b'{"again": 1}', {CALL_ID: "answered-next-0123456789"})
    assert json.loads(msg.data)["structuredContent"] == {"again": 1}
    await nc.close()


async def test_a_cancel_that_overtakes_its_request_still_cancels(mesh: Mesh) -> None:
    nc = await ready(mesh)
    call_id = "early-cancel-0123456789"
    await nc.publish(cancel_subject(call_id), b"")
    await nc.flush()
    await asyncio.sleep(0.1)
    got = await raw(nc, HOLD, b'{"seconds": 1, "tag": "early"}', {CALL_ID: call_id}, wait=2)
    assert got == [], "a call cancelled before it came was answered"
    assert not [e for e in mesh.events() if e[3] == "early"], "a call cancelled before it came reached the child"
    await nc.close()


async def test_progress_arrives_in_order_and_only_when_asked(mesh: Mesh) -> None:
    nc = await ready(mesh)
    got = await raw(nc, "mesh.tool.calls.progress", b'{"steps": 20}', {PROGRESS: "1"})
    frames = [json.loads(m.data) for m in got if m.headers and m.headers.get(FRAME) == "progress"]
    assert frames == [{"progress": i, "total": 20, "message": f"step {i}"} for i in range(1, 21)]
    final = tool_result(got[-1].data)
    assert final["structuredContent"]["token"] is not None
    # Without the header: no token for the child, one message back.
    got = await raw(nc, "mesh.tool.calls.progress", b'{"steps": 5}', {}, wait=2)
    assert len(got) == 1 and tool_result(got[0].data)["structuredContent"]["token"] is None
    got = await raw(nc, "mesh.tool.calls.progress", b'{"steps": 5}', {CALL_ID: "no-progress-0123456789"}, wait=2)
    assert len(got) == 1 and tool_result(got[0].data)["structuredContent"]["token"] is None
    await nc.close()


async def test_errors_of_a_call_with_progress_are_the_same_errors(mesh: Mesh) -> None:
    nc = await ready(mesh)
    got = await raw(nc, "mesh.tool.calls.nope", b"{}", {PROGRESS: "1"})
    assert error_of(got[-1])[0] == 404
    got = await raw(nc, HOLD, b'{"seconds": 3, "tag": "progress-deadline"}', {PROGRESS: "1", TIMEOUT_MS: "200"})
    code, body = error_of(got[-1])
    assert code == 504 and body["error"]["deadline"] == "caller", body
    got = await raw(nc, "mesh.tool.calls.typed", b'{"count": 1}', {PROGRESS: "1"})
    assert error_of(got[-1])[0] == 400
    await nc.close()


async def test_a_long_call_sends_keepalives(mesh: Mesh) -> None:
    nc = await ready(mesh)
    got = await raw(nc, HOLD, b'{"seconds": 1.2, "tag": "keepalive"}', {PROGRESS: "1"})
    keepalives = [json.loads(m.data) for m in got if m.headers and m.headers.get(FRAME) == "keepalive"]
    assert len(keepalives) >= 2, f"{len(keepalives)} keepalives in 1.2 s at one per {KEEPALIVE_S} s"
    assert [k["elapsed_ms"] for k in keepalives] == sorted(k["elapsed_ms"] for k in keepalives)
    assert json.loads(got[-1].data)["content"][0]["text"] == "held"
    await nc.close()


async def test_10_mb_result_through_the_object_store_gone_after_its_ttl(mesh: Mesh) -> None:
    nc = await ready(mesh)
    size = 10 * 1024 * 1024
    [msg] = await raw(nc, "mesh.tool.calls.big", json.dumps({"bytes": size}).encode(), {}, wait=30)
    name = msg.headers[RESULT_OBJECT]
    ref = json.loads(msg.data)
    assert ref["bucket"] == "mesh-calls" and ref["name"] == name and ref["size"] > size
    # The client library resolves it transparently.
    caller = MeshClient(nc)
    result = tool_result(await caller.call("mesh.tool.calls.big", {"bytes": size}, timeout_s=30))
    assert result["content"][0]["text"] == "x" * size
    store = await nc.jetstream().object_store("mesh-calls")
    assert (await store.get_info(name)).size == ref["size"]
    deadline = time.monotonic() + TTL_S + 10
    while time.monotonic() < deadline:
        try:
            await store.get_info(name)
        except NotFoundError:
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError(f"object {name} still there {TTL_S + 10} s after it was put (TTL {TTL_S} s)")
    await caller.close()
    await nc.close()


async def test_past_the_cap_is_413_naming_the_cap(mesh: Mesh) -> None:
    nc = await ready(mesh)
    [msg] = await raw(nc, "mesh.tool.calls.big", json.dumps({"bytes": CAP + 1000}).encode(), {}, wait=30)
    code, body = error_of(msg)
    assert code == 413 and body["error"]["cap"] == CAP and str(CAP) in body["error"]["message"]
    await nc.close()


async def test_a_request_larger_than_a_message_goes_through_the_object_store(mesh: Mesh) -> None:
    nc = await ready(mesh)
    caller = MeshClient(nc)
    args = {"blob": "y" * (3 * 1024 * 1024)}
    result = tool_result(await caller.call("mesh.tool.calls.mirror", args, timeout_s=30))
    assert result["structuredContent"] == args
    # The node deleted the request object once it had read it.
    store = await nc.jetstream().object_store("mesh-calls")
    names = [o.name for o in await store.list(ignore_deletes=True)]
    assert not [n for n in names if n.startswith("req.")], names
    await caller.close()
    await nc.close()


@pytest.mark.parametrize(
    "headers, named",
    [
        ({TIMEOUT_MS: "soon"}, TIMEOUT_MS),
        ({TIMEOUT_MS: "0"}, TIMEOUT_MS),
        ({CALL_ID: "short"}, CALL_ID),
        ({CALL_ID: "x" * 300}, CALL_ID),
        ({PROGRESS: "yes"}, PROGRESS),
        ({"Mesh-Timeout": "100"}, "Mesh-Timeout"),
        ({REQUEST_OBJECT: "res.0123456789abcdef0123"}, REQUEST_OBJECT),
        ({REQUEST_OBJECT: "req.0123456789abcdef0123"}, REQUEST_OBJECT),  # with a body: 400
    ],
)
async def test_bad_headers_are_400_naming_the_header(mesh: Mesh, headers: dict[str, str], named: str) -> None:
    nc = await ready(mesh)
    [msg] = await raw(nc, "mesh.tool.calls.echo", b'{"a": 1}', headers)
    code, body = error_of(msg)
    assert code == 400 and named in body["error"]["message"] and named in body["error"]["field"], body
    await nc.close()


async def test_client_progress_cancel_and_errors(mesh: Mesh) -> None:
    nc = await ready(mesh)
    caller = MeshClient(nc, keepalive_s=KEEPALIVE_S)
    seen: list[ProgressFrame] = []
    result = tool_result(await caller.call("mesh.tool.calls.progress", {"steps": 7}, on_progress=seen.append))
    assert [f.progress for f in seen] == [1, 2, 3, 4, 5, 6, 7] and seen[-1].message == "step 7"
    assert result["structuredContent"]["steps"] == 7
    # Cancelling the awaiting scope cancels the call in the child.
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller.call, HOLD, {"seconds": 5, "tag": "client-cancel"})
            rid = await mesh.started("client-cancel")
            tg.cancel_scope.cancel()
    assert await mesh.wait_cancelled(rid)
    with pytest.raises(NodeRefused) as e:
        await caller.call("mesh.tool.calls.nope", {})
    assert e.value.code == 404
    with pytest.raises(NoResponders):
        await caller.call("mesh.tool.nobody.here", {}, timeout_s=5)
    await caller.close()
    await nc.close()


def test_meshctl_call_shows_progress_and_cancels_on_sigint(mesh: Mesh) -> None:
    env = dict(os.environ)
    base = [*MESHCTL, "call", "--nats", mesh.url]
    r = subprocess.run(
        [*base, "tool.calls.progress", '{"steps": 4}'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("progress")] == [
        f"progress {i}/4 step {i}" for i in range(1, 5)
    ]
    assert "done" in r.stdout
    proc = subprocess.Popen(
        [*base, "tool.calls.hold", '{"seconds": 20, "tag": "sigint"}'],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rid = anyio.run(mesh.started, "sigint", 30)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        stop_process(proc)  # type: ignore[arg-type]
    assert proc.returncode == 130, err
    assert "cancelled" in err
    [(_, reason)] = anyio.run(mesh.wait_cancelled, rid)
    assert "Ctrl-C" in reason


async def test_the_client_learns_the_keepalive_interval_and_names_a_silent_node(mesh: Mesh) -> None:
    nc = await ready(mesh)
    # Assumes 50 ms until the node's first keepalive says 300 ms: a 1 s call is not taken for dead.
    caller = MeshClient(nc, keepalive_s=0.05)
    seen: list[ProgressFrame] = []
    result = tool_result(await caller.call(HOLD, {"seconds": 1, "tag": "learn"}, on_progress=seen.append))
    assert result["content"][0]["text"] == "held"
    # A responder that says it speaks every 100 ms and then falls silent: NodeSilent after three.

    async def once_then_silent(msg: Msg) -> None:
        await nc.publish(msg.reply, b'{"elapsed_ms":0,"interval_ms":100}', headers={FRAME: "keepalive"})

    sub = await nc.subscribe("test.silent", cb=once_then_silent)
    t = time.monotonic()
    with pytest.raises(NodeSilent):
        await caller.call("test.silent", {}, timeout_s=10, on_progress=seen.append)
    took = time.monotonic() - t
    assert took < 5, f"took {took:.1f} s to give up on a node silent after saying 100 ms"
    await sub.unsubscribe()
    await caller.close()
    await nc.close()


def test_meshctl_call_draws_a_progress_bar_on_a_terminal(mesh: Mesh) -> None:
    import pty

    master, slave = pty.openpty()  # stderr is a terminal: the bar; stdout stays a pipe for the result
    proc = subprocess.Popen(
        [*MESHCTL, "call", "--nats", mesh.url, "tool.calls.progress", '{"steps": 4, "delay": 0.05}'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other end closed: meshctl is done
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    out = proc.stdout.read() if proc.stdout else b""
    assert proc.wait(30) == 0
    assert b"\r\x1b[K[" + b"#" * 30 + b"] 4/4 step 4" in drawn, drawn
    assert b"\r\x1b[K[" + b"#" * 7 + b"." * 23 + b"] 1/4 step 1" in drawn, drawn
    assert drawn.endswith(b"\r\x1b[K"), "the bar is not cleared before the result"
    assert b"progress 1/4" not in drawn and b"done" in out


async def test_keepalives_flow_while_the_call_waits_for_its_bundle_to_start(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "slow", env={"RAW_MODE": "slow_start", "RAW_START_DELAY": "1.5"})
    node = node_factory(tmp_path / "mods", config=CONFIG)
    nc = await client(node.bus_url())
    status = {b["bundle"]: b["state"] for b in (await nc_status(nc, node.name))["bundles"]}
    assert status == {"tools": "starting"}, status
    got = await raw(nc, "mesh.tool.slow.echo", b'{"waited": true}', {PROGRESS: "1"}, wait=10)
    keepalives = [json.loads(m.data) for m in got if m.headers and m.headers.get(FRAME) == "keepalive"]
    assert len(keepalives) >= 3 and keepalives[0]["elapsed_ms"] < KEEPALIVE_S * 1000, keepalives
    assert json.loads(got[-1].data)["structuredContent"] == {"waited": True}
    await nc.close()
