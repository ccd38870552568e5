"""The call protocol across NATS accounts, as a deployment runs it (docs/bus.md, "Permissions").

The node is in account MESH, which exports `mesh.tool.>` (response_type stream: progress frames
are several replies) and `mesh.cancel.*`; callers in accounts A and B import both with
share: true, so the server stamps each request and cancel with the caller's account. A cancel
from B for A's call is ignored; A's own cancel reaches the child; A gets progress frames.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Iterator

import anyio
import nats
import pytest

from runtime.client import CallError, MeshClient, tool_result
from runtime.wire.callproto import CALL_ID, FRAME, PROGRESS
from runtime.wire.subjects import cancel_subject, fetch_subject
from tests.faults.security_support import ConfiguredServer, node_config
from tests.support.mesh import NodeProcess, make_module

ACCOUNTS = """
accounts {
  MESH {
    jetstream: enabled
    # The node may not publish calls itself: inside MESH no client could then write a stamp.
    users [{user: node, password: nodepw, permissions: {publish: {deny: ["mesh.tool.>", "mesh.seat.>", "mesh.cancel.*", "mesh.fetch.>", "mesh.answer.>", "mesh.task.*"]}}}]
    exports [
      {service: "mesh.tool.>", response_type: stream, response_threshold: "10m"}
      {service: "mesh.cancel.*"}
      {service: "mesh.fetch.>", response_type: stream}
    ]
  }
  A {
    users [{user: alice, password: alicepw}]
    imports [
      {service: {account: MESH, subject: "mesh.tool.>"}, share: true}
      {service: {account: MESH, subject: "mesh.cancel.*"}, share: true}
      {service: {account: MESH, subject: "mesh.fetch.>"}, share: true}
    ]
  }
  B {
    users [{user: bob, password: bobpw}]
    imports [
      {service: {account: MESH, subject: "mesh.tool.>"}, share: true}
      {service: {account: MESH, subject: "mesh.cancel.*"}, share: true}
      {service: {account: MESH, subject: "mesh.fetch.>"}, share: true}
    ]
  }
}
"""


class Stack:
    def __init__(self, server: ConfiguredServer, node: NodeProcess, log: Path) -> None:
        self.server, self.node, self.log = server, node, log

    def lines(self, event: str) -> list[list[str]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [line.split(" ", 3) for line in text.splitlines() if line.split(" ")[1] == event]

    async def started(self, tag: str) -> str:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for parts in self.lines("started"):
                if parts[3:] == [tag]:
                    return parts[2]
            await asyncio.sleep(0.01)
        raise AssertionError(f"hold {tag} never started")

    def cancelled(self, rid: str) -> bool:
        return any(parts[2] == rid for parts in self.lines("cancelled"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("accounts")
    server = ConfiguredServer(work / "nats", ACCOUNTS).start()
    log = work / "calls.log"
    make_module(work / "modules", "calls", env={"RAW_CALL_LOG": str(log)}, timeout_ms=10000)
    config = node_config({"url": server.url, "user": "node", "password": "nodepw"}) + "\n[calls]\nkeepalive_s = 0.5\n"
    node = NodeProcess(work, work / "modules", None, "acc-node", config=config)
    try:
        node.wait_log("bundle calls/tools ready", timeout=30)
        yield Stack(server, node, log)
    finally:
        node.kill()
        server.stop()


async def as_user(stack: Stack, user: str) -> nats.NATS:
    return await nats.connect(stack.server.url, user=user, password=f"{user}pw")


async def test_cancel_from_another_account_is_ignored_and_the_callers_own_is_honoured(stack: Stack) -> None:
    alice, bob = await as_user(stack, "alice"), await as_user(stack, "bob")
    call_id = "alice-call-0123456789abc"
    inbox = alice.new_inbox()
    sub = await alice.subscribe(inbox)
    await alice.publish(
        "mesh.tool.calls.hold", b'{"seconds": 8, "tag": "acc"}', reply=inbox, headers={CALL_ID: call_id}
    )
    rid = await stack.started("acc")
    await bob.publish(cancel_subject(call_id), b'{"reason": "bob tries"}')
    await bob.flush()
    await asyncio.sleep(0.5)
    assert not stack.cancelled(rid), "a cancel from account B cancelled account A's call"
    assert "ignored a cancel of call" in stack.node.log() and "from account B" in stack.node.log()
    await alice.publish(cancel_subject(call_id), b"")
    await alice.flush()
    deadline = time.monotonic() + 3
    while not stack.cancelled(rid) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert stack.cancelled(rid), "the caller's own cancel did not reach the child"
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.5)
    await alice.close()
    await bob.close()


async def test_progress_frames_cross_the_account_boundary(stack: Stack) -> None:
    alice = await as_user(stack, "alice")
    inbox = alice.new_inbox()
    sub = await alice.subscribe(inbox)
    await alice.publish("mesh.tool.calls.progress", b'{"steps": 5}', reply=inbox, headers={PROGRESS: "1"})
    frames, final = [], None
    with anyio.fail_after(10):
        while final is None:
            msg = await sub.next_msg(timeout=10)
            if msg.headers and msg.headers.get(FRAME) == "progress":
                frames.append(json.loads(msg.data)["progress"])
            elif not (msg.headers and FRAME in msg.headers):
                final = msg
    assert frames == [1, 2, 3, 4, 5] and tool_result(final.data)["content"][0]["text"] == "done"
    # The client library does the same for a caller in another account.
    caller = MeshClient(alice)
    seen: list[float] = []
    await caller.call("mesh.tool.calls.progress", {"steps": 3}, on_progress=lambda f: seen.append(f.progress))
    assert seen == [1, 2, 3]
    await caller.close()
    await alice.close()


async def test_a_result_larger_than_a_message_reaches_its_caller_only(stack: Stack) -> None:
    """Parked in the mesh's object store, read back through a node: no JetStream permission needed
    by the caller, and another account cannot read it even knowing its name."""
    alice, bob = await as_user(stack, "alice"), await as_user(stack, "bob")
    size = 3 * 1024 * 1024
    inbox = alice.new_inbox()
    sub = await alice.subscribe(inbox)
    await alice.publish("mesh.tool.calls.big", json.dumps({"bytes": size}).encode(), reply=inbox)
    ref = json.loads((await sub.next_msg(timeout=30)).data)
    caller = MeshClient(alice)
    result = tool_result(await caller.call("mesh.tool.calls.big", {"bytes": size}, timeout_s=30))
    assert result["content"][0]["text"] == "x" * size
    msg = await bob.request(fetch_subject(ref["name"]), b"", timeout=10)
    assert (msg.headers or {}).get("Nats-Service-Error-Code") == "404", msg.headers
    await caller.close()
    await alice.close()
    await bob.close()


async def test_arguments_larger_than_a_message_from_another_account_are_a_clear_413(stack: Stack) -> None:
    alice = await as_user(stack, "alice")  # account A has no JetStream: it cannot hand arguments over
    caller = MeshClient(alice)
    with pytest.raises(CallError) as e:
        await caller.call("mesh.tool.calls.mirror", {"blob": "z" * (2 * 1024 * 1024)}, timeout_s=10)
    assert e.value.code == 413 and "JetStream" in e.value.message and "mesh-calls" in e.value.message
    # The connection serves on.
    assert tool_result(await caller.call("mesh.tool.calls.echo", {"after": 1}))["structuredContent"] == {"after": 1}
    await caller.close()
    await alice.close()
