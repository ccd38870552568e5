"""Asking and detached calls across NATS accounts, on a node process and a real child (docs/bus.md,
"Asking", "Detached calls"): the server's config is the one the embedded bus writes
(runtime/bus/accounts.py), callers alice (account A) and bob (account B).

An ask's answer is taken only from the call's own account; a task is seen, waited for and cancelled
only by its own caller; the mesh account's users may publish neither answers nor task requests.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Iterator

import anyio
import msgspec
import nats
import pytest

from runtime.bus.accounts import accounts_block
from runtime.client import AskFrame, MeshClient, NodeRefused, tool_result
from runtime.wire.asking import AnswerBody, TaskQuery, task_subject
from tests.faults.security_support import ConfiguredServer, node_config
from tests.support.mesh import MESHCTL, ROOT, NodeProcess, make_module

CONFIRM = "mesh.tool.asks.confirm"
HOLD = "mesh.tool.asks.hold"


class Stack:
    def __init__(self, server: ConfiguredServer, node: NodeProcess) -> None:
        self.server, self.node = server, node

    async def user(self, name: str) -> nats.NATS:
        return await nats.connect(self.server.url, user=name, password=f"{name}pw")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("asking")
    block = accounts_block([("node", "nodepw")], [("A", "alice", "alicepw"), ("B", "bob", "bobpw")])
    server = ConfiguredServer(work / "nats", block).start()
    make_module(work / "modules", "asks", env={"RAW_CALL_LOG": str(work / "calls.log")}, timeout_ms=20000)
    config = node_config({"url": server.url, "user": "node", "password": "nodepw"})
    node = NodeProcess(work, work / "modules", None, "ask-node", config=config)
    try:
        node.wait_log("bundle asks/tools ready", timeout=30)
        assert "server-stamped" in node.log(), node.log()[-2000:]
        yield Stack(server, node)
    finally:
        node.kill()
        server.stop()


def saw(result: bytes) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(tool_result(result)["content"][0]["text"])
    return seen


async def test_an_answer_is_taken_only_from_the_calls_own_account(stack: Stack) -> None:
    alice, bob = await stack.user("alice"), await stack.user("bob")
    tried: list[str] = []

    async def on_ask(frame: AskFrame) -> dict[str, Any]:
        # Bob learns the answer subject (it leaked): his answer finds no ask.
        body = msgspec.json.encode(AnswerBody(result=msgspec.Raw(b'{"action": "accept", "content": {"ok": false}}')))
        got = await bob.request(frame.answer, body, timeout=5)
        tried.append((got.headers or {}).get("Nats-Service-Error-Code", "taken"))
        return {"action": "accept", "content": {"ok": True}}

    result = await MeshClient(alice).call(CONFIRM, {"question": "Ship it?"}, timeout_s=15, on_ask=on_ask)
    assert tried == ["404"]
    assert saw(result)["result"] == {"action": "accept", "content": {"ok": True}}
    await alice.close()
    await bob.close()


async def test_a_caller_without_answers_makes_the_child_see_an_error_at_once(stack: Stack) -> None:
    alice = await stack.user("alice")
    result = await MeshClient(alice).call(CONFIRM, {}, timeout_s=5)
    assert "cannot answer" in saw(result)["error"]["message"]
    await alice.close()


async def test_a_task_is_its_callers_alone(stack: Stack) -> None:
    alice, bob = await stack.user("alice"), await stack.user("bob")
    mine, theirs = MeshClient(alice), MeshClient(bob)
    record = await mine.start(HOLD, {"seconds": 0.5, "tag": "task-a"})
    assert record.state == "working"
    for verb in ("get", "cancel", "result"):
        with pytest.raises(NodeRefused) as e:
            await theirs._task_request(task_subject(verb), msgspec.json.encode(TaskQuery(task=record.task)), None, 5)
        assert e.value.code == 404, verb
    assert (await theirs.tasks()).tasks == []
    done = await mine.task_result(record.task, wait_s=10)
    assert done.state == "completed" and [t.task for t in (await mine.tasks()).tasks] == [record.task]
    await alice.close()
    await bob.close()


async def test_the_mesh_accounts_users_may_not_answer_or_read_tasks(stack: Stack) -> None:
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    node = await nats.connect(stack.server.url, user="node", password="nodepw", error_cb=on_error)
    await node.publish("mesh.answer.ask-node.abcdefghijklmnopqrstuv.1", b'{"result": {}}')
    await node.publish(task_subject("list"), b"{}")
    await node.flush()
    with anyio.move_on_after(3):
        while len(errors) < 2:
            await anyio.sleep(0.02)
    await node.close()
    assert sum("permissions violation" in e.lower() for e in errors) == 2, errors


def test_the_node_log_names_no_unverified_identity(stack: Stack) -> None:
    assert "unverified" not in Path(stack.node.log_path).read_text()


def meshctl_as_alice(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    base = [*MESHCTL, *args[:1], "--nats", stack.server.url, "--user", "alice", "--password", "alicepw"]
    return subprocess.run(
        [*base, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_meshctl_call_with_answers_completes_an_eliciting_tool(stack: Stack, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([{"ok": True}]))
    r = meshctl_as_alice(stack, "call", "tool.asks.confirm", '{"question": "Ship it?"}', "--answers", str(answers))
    assert r.returncode == 0, r.stderr
    assert "the tool asks: Ship it?" in r.stderr
    assert json.loads(r.stdout)["result"] == {"action": "accept", "content": {"ok": True}}
    # Without answers and off a terminal the tool learns at once that its caller cannot answer.
    r = meshctl_as_alice(stack, "call", "tool.asks.confirm", "{}")
    assert "cannot answer" in json.loads(r.stdout)["error"]["message"]


def test_meshctl_detached_call_and_its_task(stack: Stack) -> None:
    r = meshctl_as_alice(stack, "call", "tool.asks.hold", '{"seconds": 0.3}', "--detach")
    assert r.returncode == 0, r.stderr
    task = json.loads(r.stdout)["task"]
    r = meshctl_as_alice(stack, "task", "result", task, "--wait", "10")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "completed", r.stdout + r.stderr
    r = meshctl_as_alice(stack, "task", "list")
    assert task in [t["task"] for t in json.loads(r.stdout)["tasks"]]
