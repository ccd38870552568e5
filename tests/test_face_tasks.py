"""MCP Tasks through `meshctl mcp` (docs/mcp.md, "Tasks"), in both eras.

2025-11-25: JSON-RPC lines to the face over stdio (the `mcp` package's client checks a tools/call's
answer as a CallToolResult, so it cannot take the CreateTaskResult of a task-augmented call; its
Tasks models check every answer here): a task-augmented `tools/call` answers with the task at once;
the face that started it is killed and a new one returns the result (the task lives on the bus, not
in the face); a caller of another account sees none of it and cannot cancel it; `tasks/cancel`
reaches the child as `notifications/cancelled`.

2026-07-28, the Tasks extension: raw JSON-RPC over stateless HTTP, the same story (a face killed in
between, `tasks/get` polling to the result, the other account refused, cancel reaching the child),
and a tool that elicits goes `input_required` until `tasks/update` answers it.

The node runs the raw child's `hold` tool (it waits `seconds` unless cancelled, and logs both to
RAW_CALL_LOG) and `confirm` (it elicits {"ok": boolean}) on a bus with accounts: alice (account A)
and bob (B).
"""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import httpx2
import mcp_types as types
import pytest
from anyio.abc import Process
from mcp.shared.exceptions import MCPError

from runtime.bus.accounts import accounts_block
from runtime.bus.embedded import free_port
from tests.faults.security_support import ConfiguredServer, node_config
from tests.support.face import wait_file
from tests.support.mesh import MESHCTL, ROOT, NodeProcess, make_module, wait_port
from tests.unit.runtime.meshctl.test_face_hot import ENVELOPE, _modern_headers

pytestmark = pytest.mark.slow


class Face:
    """One `meshctl mcp` over stdio, initialized in the 2025-11-25 era; requests one at a time."""

    def __init__(self, proc: Process) -> None:
        self.proc, self.ids, self.buffer = proc, 0, b""

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while b"\n" not in self.buffer:
            self.buffer += await self.proc.stdout.receive()
        line, _, self.buffer = self.buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The result of one request; MCPError for its error."""
        self.ids += 1
        await self.send({"id": self.ids, "method": method, **({"params": params} if params is not None else {})})
        while True:
            message = await self.line()
            if message.get("id") == self.ids:
                if "error" in message:
                    raise MCPError(code=message["error"]["code"], message=message["error"]["message"])
                answer: dict[str, Any] = message["result"]
                return answer


class Stack:
    def __init__(self, server: ConfiguredServer, node: NodeProcess, work: Path) -> None:
        self.server, self.node, self.work = server, node, work
        self.calls = work / "calls.log"

    @asynccontextmanager
    async def face(self, user: str) -> AsyncIterator[Face]:
        command = [*MESHCTL, "mcp", "--nats", self.server.url, "--user", user, "--password", f"{user}pw"]
        async with await anyio.open_process(command, cwd=ROOT) as proc:
            face = Face(proc)
            try:
                initialize = {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                }
                offered = await face.request("initialize", initialize)
                assert offered["capabilities"].get("tasks"), offered
                await face.send({"method": "notifications/initialized"})
                yield face
            finally:
                proc.kill()  # killed, not closed: what the face knew is gone with it


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("face-tasks")
    block = accounts_block([("node", "nodepw")], [("A", "alice", "alicepw"), ("B", "bob", "bobpw")])
    server = ConfiguredServer(work / "nats", block).start()
    make_module(work / "modules", "jobs", env={"RAW_CALL_LOG": str(work / "calls.log")}, timeout_ms=120000)
    config = node_config({"url": server.url, "user": "node", "password": "nodepw"})
    node = NodeProcess(work, work / "modules", None, "face-tasks-node", config=config)
    try:
        node.wait_log("bundle jobs/tools ready", timeout=30)
        yield Stack(server, node, work)
    finally:
        node.kill()
        server.stop()


async def start_task(c: Face, tool: str, arguments: dict[str, Any]) -> types.CreateTaskResult:
    params = {"name": tool, "arguments": arguments, "task": {"ttl": 300_000}}
    return types.CreateTaskResult.model_validate(await c.request("tools/call", params))


async def get(c: Face, task: str) -> types.GetTaskResult:
    return types.GetTaskResult.model_validate(await c.request("tasks/get", {"taskId": task}))


async def result(c: Face, task: str) -> dict[str, Any]:
    payload = await c.request("tasks/result", {"taskId": task})
    types.CallToolResult.model_validate(payload)  # what the task's tools/call would have answered
    return payload


async def cancel(c: Face, task: str) -> types.CancelTaskResult:
    return types.CancelTaskResult.model_validate(await c.request("tasks/cancel", {"taskId": task}))


async def listed(c: Face) -> list[str]:
    return [t.task_id for t in types.ListTasksResult.model_validate(await c.request("tasks/list")).tasks]


def started_rid(calls: Path, tag: str) -> str:
    """The child's request id of the hold call tagged `tag` (its 'started' line in RAW_CALL_LOG)."""
    wait_file(calls, f" {tag}", timeout=15)
    for line in calls.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "started" and parts[3] == tag:
            return parts[2]
    raise AssertionError(f"no started line tagged {tag} in {calls.read_text()!r}")


async def test_a_task_outlives_its_face_and_is_only_its_callers(stack: Stack) -> None:
    began = time.monotonic()
    async with stack.face("alice") as c:
        created = await start_task(c, "jobs_hold", {"seconds": 20, "tag": "outlives"})
        handed = time.monotonic() - began
    task = created.task.task_id
    assert created.task.status == "working", created
    # The handle came while the 20 s tool still runs (the face's own start-up is in this figure).
    assert handed < 15, f"the task handle took {handed:.1f} s"
    rid = started_rid(stack.calls, "outlives")

    async with stack.face("bob") as b:
        for ask in (get, result, cancel):
            with pytest.raises(MCPError, match="no task"):
                await ask(b, task)
        assert task not in await listed(b)

    async with stack.face("alice") as c:  # a new face: the first one's process is gone
        assert (await get(c, task)).status == "working"
        assert task in await listed(c)
        with anyio.fail_after(60):
            done = await result(c, task)
    assert done["content"] == [{"type": "text", "text": "held"}], done
    assert done["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task}
    assert f"answered {rid}" in stack.calls.read_text()
    assert f"cancelled {rid}" not in stack.calls.read_text(), "bob's cancel reached alice's call"
    assert time.monotonic() - began >= 20


async def test_cancel_reaches_the_childs_work(stack: Stack) -> None:
    async with stack.face("alice") as c:
        created = await start_task(c, "jobs_hold", {"seconds": 60, "tag": "cancelled"})
        task = created.task.task_id
        rid = started_rid(stack.calls, "cancelled")
        after = await cancel(c, task)
        assert after.status == "cancelled", after
        wait_file(stack.calls, f"cancelled {rid}", timeout=10)
        assert (await get(c, task)).status == "cancelled"
        with anyio.fail_after(20):
            ended = await result(c, task)
    assert ended.get("isError") is True and "cancelled" in ended["content"][0]["text"], ended


async def test_tasks_get_names_what_is_wrong(stack: Stack) -> None:
    async with stack.face("alice") as c:
        tools = {t["name"]: t for t in (await c.request("tools/list"))["tools"]}
        assert tools["jobs_hold"]["execution"] == {"taskSupport": "optional"}, tools["jobs_hold"]
        assert "execution" not in tools["jobs_echo"]
        with pytest.raises(MCPError, match="must be a task id") as refused:
            await get(c, "not a task")
        assert refused.value.error.code == -32602, refused.value.error
        with pytest.raises(MCPError, match="no task"):
            await get(c, "A" * 22)
        with pytest.raises(MCPError, match="needs params.taskId"):
            await c.request("tasks/get", {})
        with pytest.raises(MCPError, match="no tool named"):
            await start_task(c, "jobs_nothing", {})


# --- 2026-07-28: the Tasks extension (face/task_extension.py), raw JSON-RPC over stateless HTTP ---------
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
WITH_TASKS: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}


@contextmanager
def modern_face(stack: Stack, user: str) -> Iterator[str]:
    """`meshctl mcp --http` as `user`; killed at the end (what the face knew is gone with it)."""
    port = free_port()
    command = [*MESHCTL, "mcp", "--nats", stack.server.url, "--http", f"127.0.0.1:{port}"]
    command += ["--user", user, "--password", f"{user}pw", "--log-level", "info"]
    with open(stack.work / f"face-{user}-{port}.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_port(port, timeout=20)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


async def modern(
    url: str, method: str, params: dict[str, Any], caps: dict[str, Any] | None = None, name: str | None = None
) -> dict[str, Any]:
    """One 2026-07-28 request (its own connection); the result, MCPError for its error."""
    meta = {**ENVELOPE, "io.modelcontextprotocol/clientCapabilities": WITH_TASKS if caps is None else caps}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    async with httpx2.AsyncClient(timeout=60) as http:
        reply = (await http.post(url, json=body, headers=_modern_headers(method, name))).json()
    if "error" in reply:
        raise MCPError(code=reply["error"]["code"], message=reply["error"]["message"])
    answer: dict[str, Any] = reply["result"]
    return answer


async def modern_start(url: str, tool: str, arguments: dict[str, Any], caps: dict[str, Any] | None = None) -> Any:
    created = await modern(url, "tools/call", {"name": tool, "arguments": arguments}, caps, name=tool)
    assert created["resultType"] == "task", created
    assert created["status"] == "working" and created["pollIntervalMs"] > 0 and created["ttlMs"] > 0, created
    return created["taskId"]


async def modern_until(url: str, task: str, status: str, timeout: float = 60) -> dict[str, Any]:
    """tasks/get, every pollIntervalMs, until the task says `status`."""
    with anyio.fail_after(timeout):
        while True:
            got = await modern(url, "tasks/get", {"taskId": task})
            if got["status"] == status:
                return got
            assert got["status"] in ("working", "input_required"), got
            await anyio.sleep(got["pollIntervalMs"] / 1000)


async def test_a_2026_task_outlives_its_face_and_is_only_its_callers(stack: Stack) -> None:
    began = time.monotonic()
    with modern_face(stack, "alice") as url:
        discovered = await modern(url, "server/discover", {})
        assert discovered["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}, discovered
        task = await modern_start(url, "jobs_hold", {"seconds": 20, "tag": "modern-outlives"})
        handed = time.monotonic() - began
        # A client that did not declare the extension: the same tool is a plain call, tasks/* not its.
        plain = await modern(url, "tools/call", {"name": "jobs_hold", "arguments": {"seconds": 0.1}}, {}, "jobs_hold")
        assert plain["resultType"] == "complete" and plain["content"] == [{"type": "text", "text": "held"}], plain
        with pytest.raises(MCPError, match="list it in the request's client capabilities") as refused:
            await modern(url, "tasks/get", {"taskId": task}, {})
        assert refused.value.error.code == -32021
    assert handed < 15, f"the task handle took {handed:.1f} s"
    rid = started_rid(stack.calls, "modern-outlives")

    with modern_face(stack, "bob") as url:
        for method in ("tasks/get", "tasks/cancel"):
            with pytest.raises(MCPError, match="no task") as refused:
                await modern(url, method, {"taskId": task})
            assert refused.value.error.code == -32602

    with modern_face(stack, "alice") as url:  # a new face: the first one's process is gone
        assert (await modern(url, "tasks/get", {"taskId": task}))["status"] == "working"
        done = await modern_until(url, task, "completed")
    assert done["result"]["content"] == [{"type": "text", "text": "held"}], done
    assert done["result"]["isError"] is False and done["resultType"] == "complete", done
    assert f"answered {rid}" in stack.calls.read_text()
    assert f"cancelled {rid}" not in stack.calls.read_text(), "bob's cancel reached alice's call"
    assert time.monotonic() - began >= 20


async def test_a_2026_cancel_reaches_the_childs_work(stack: Stack) -> None:
    with modern_face(stack, "alice") as url:
        task = await modern_start(url, "jobs_hold", {"seconds": 60, "tag": "modern-cancelled"})
        rid = started_rid(stack.calls, "modern-cancelled")
        acked = await modern(url, "tasks/cancel", {"taskId": task})
        assert acked["resultType"] == "complete" and set(acked) <= {"resultType", "_meta"}, acked
        wait_file(stack.calls, f"cancelled {rid}", timeout=10)
        assert (await modern(url, "tasks/get", {"taskId": task}))["status"] == "cancelled"


async def test_a_2026_task_that_asks_is_answered_with_tasks_update(stack: Stack) -> None:
    caps = {**WITH_TASKS, "elicitation": {"form": {}}}
    with modern_face(stack, "alice") as url:
        task = await modern_start(url, "jobs_confirm", {"question": "Ship it?"}, caps)
        asked = await modern_until(url, task, "input_required", timeout=20)
        [(key, request)] = asked["inputRequests"].items()
        assert request["method"] == "elicitation/create" and request["params"]["message"] == "Ship it?", asked
        assert "mesh/call" not in (request["params"].get("_meta") or {}), "the mesh's call reference leaked"
        with pytest.raises(MCPError, match="inputResponses") as refused:
            await modern(url, "tasks/update", {"taskId": task, "inputResponses": {key: {"action": "maybe"}}})
        assert refused.value.error.code == -32602
        answers = {key: {"action": "accept", "content": {"ok": True}}, "99": {"action": "decline"}}
        acked = await modern(url, "tasks/update", {"taskId": task, "inputResponses": answers})
        assert acked["resultType"] == "complete", acked
        done = await modern_until(url, task, "completed", timeout=20)
    seen = json.loads(done["result"]["content"][0]["text"])
    assert seen["result"] == {"action": "accept", "content": {"ok": True}}, done


async def test_2026_tasks_requests_name_what_is_wrong(stack: Stack) -> None:
    with modern_face(stack, "alice") as url:
        for params, says in (
            ({}, "needs params.taskId"),
            ({"taskId": "not a task"}, "must be a task id"),
            ({"taskId": "A" * 22}, "no task"),
        ):
            with pytest.raises(MCPError, match=says) as refused:
                await modern(url, "tasks/get", params)
            assert refused.value.error.code == -32602, (params, refused.value.error)
        with pytest.raises(MCPError, match="needs params.inputResponses") as refused:
            await modern(url, "tasks/update", {"taskId": "A" * 22, "inputResponses": "yes"})
        assert refused.value.error.code == -32602
