"""A tool that asks, and calls that outlive their caller, through `meshctl mcp` (docs/mcp.md, "Asking",
"Tasks"), with the `mcp` package's own client: over stdio in the 2025-11-25 era (the face's
elicitation/create to the client), over HTTP in the 2026-07-28 era (an InputRequiredResult the client
answers and re-sends). The node runs the raw child's `confirm` tool (it elicits {"ok": boolean} and
answers with what it got) on a bus with accounts: the face calls as alice (account A), another face
as bob (account B).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client import Client

from runtime.bus.accounts import accounts_block
from tests.faults.security_support import ConfiguredServer, node_config
from tests.support.face import http_face, meshctl_mcp, stdio_face
from tests.support.mesh import NodeProcess, make_module
from tests.unit.runtime.meshctl.test_face_hot import ENVELOPE, _modern_headers


class Stack:
    def __init__(self, server: ConfiguredServer, node: NodeProcess, work: Path) -> None:
        self.server, self.node, self.work = server, node, work

    def face_args(self, user: str) -> list[str]:
        return ["--user", user, "--password", f"{user}pw"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("face-asking")
    block = accounts_block([("node", "nodepw")], [("A", "alice", "alicepw"), ("B", "bob", "bobpw")])
    server = ConfiguredServer(work / "nats", block).start()
    make_module(work / "modules", "asks", env={"RAW_CALL_LOG": str(work / "calls.log")}, timeout_ms=60000)
    config = node_config({"url": server.url, "user": "node", "password": "nodepw"})
    node = NodeProcess(work, work / "modules", None, "face-ask-node", config=config)
    try:
        node.wait_log("bundle asks/tools ready", timeout=30)
        yield Stack(server, node, work)
    finally:
        node.kill()
        server.stop()


def answer_of(result: types.CallToolResult) -> dict[str, Any]:
    """What the tool got back from its elicitation (the raw child's confirm says it as JSON)."""
    block = result.content[0]
    assert isinstance(block, types.TextContent), result
    seen: dict[str, Any] = json.loads(block.text)
    return seen


def answering(action: str, content: dict[str, Any] | None = None, asked: list[Any] | None = None) -> Any:
    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if asked is not None:
            asked.append(params)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return callback


async def test_a_legacy_session_is_asked_and_its_answer_reaches_the_tool(stack: Stack) -> None:
    asked: list[Any] = []
    face = stdio_face(stack.server.url, *stack.face_args("alice"))
    async with Client(
        face, mode="legacy", cache=None, elicitation_callback=answering("accept", {"ok": True}, asked)
    ) as c:
        result = await c.call_tool("asks_confirm", {"question": "Delete the branch?"})
    assert answer_of(result)["result"] == {"action": "accept", "content": {"ok": True}}
    [params] = asked
    assert isinstance(params, types.ElicitRequestFormParams) and params.message == "Delete the branch?"
    assert params.requested_schema["properties"]["ok"]["type"] == "boolean"
    assert params.meta is None or "mesh/call" not in (params.meta or {}), "the mesh's call reference leaked"


async def test_a_decline_reaches_the_tool(stack: Stack) -> None:
    face = stdio_face(stack.server.url, *stack.face_args("alice"))
    async with Client(face, mode="legacy", cache=None, elicitation_callback=answering("decline")) as c:
        result = await c.call_tool("asks_confirm", {"question": "Go on?"})
    assert answer_of(result)["result"] == {"action": "decline"}


async def test_a_client_without_the_capability_makes_the_tool_see_an_error_at_once(stack: Stack) -> None:
    face = stdio_face(stack.server.url, *stack.face_args("alice"))
    async with Client(face, mode="legacy", cache=None) as c:
        with anyio.fail_after(10):  # the tool's timeout is 60 s: at once, not then
            result = await c.call_tool("asks_confirm", {"question": "Go on?"})
    assert "cannot answer" in answer_of(result)["error"]["message"]


async def test_a_2026_client_answers_an_input_required_result_and_the_tool_resumes(stack: Stack) -> None:
    asked: list[Any] = []
    with http_face(stack.server.url, stack.work / "face-modern.log", *stack.face_args("alice")) as endpoint:
        callback = answering("accept", {"ok": False}, asked)
        async with Client(endpoint, mode="2026-07-28", cache=None, elicitation_callback=callback) as c:
            result = await c.call_tool("asks_confirm", {"question": "Rotate the key?"})
    assert answer_of(result)["result"] == {"action": "accept", "content": {"ok": False}}
    assert [p.message for p in asked] == ["Rotate the key?"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_session_that_answers_asks_still_gets_the_tools_progress(stack: Stack, transport: str) -> None:
    """A client that declared elicitation is served the package's way (not the hot path): its call's
    progress reaches it as any other client's does (the conformance suite's tools-call-with-progress)."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with http_face(stack.server.url, stack.work / f"face-progress-{transport}.log", *stack.face_args("alice")) as url:
        target: Any = stdio_face(stack.server.url, *stack.face_args("alice")) if transport == "stdio" else url
        async with Client(target, mode="legacy", cache=None, elicitation_callback=answering("decline")) as c:
            with anyio.fail_after(20):
                result = await c.call_tool("asks_progress", {"steps": 3, "delay": 0.02}, progress_callback=on_progress)
    assert result.is_error is False
    assert [(p, t) for p, t, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert [m for _, _, m in seen] == ["step 1", "step 2", "step 3"]


def _modern_call(rid: int, arguments: dict[str, Any], **more: Any) -> dict[str, Any]:
    meta = {**ENVELOPE, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}
    params = {"name": "asks_confirm", "arguments": arguments, "_meta": meta, **more}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


async def _ask_then_answer(asker: str, answerer: str, question: str) -> dict[str, Any]:
    """A 2026-07-28 call sent to `asker`, its InputRequiredResult answered (accept, ok) to `answerer`, each on
    a connection of its own; what the tool got back."""
    close = {**_modern_headers("tools/call", "asks_confirm"), "Connection": "close"}
    async with httpx2.AsyncClient(timeout=60) as http:
        first = await http.post(asker, json=_modern_call(1, {"question": question}), headers=close)
        asked = first.json()["result"]
        assert asked["resultType"] == "input_required", first.text
        [(key, request)] = asked["inputRequests"].items()
        assert request["params"]["message"] == question, asked
        answers = {key: {"action": "accept", "content": {"ok": True}}}
        retry = _modern_call(2, {"question": question}, inputResponses=answers, requestState=asked["requestState"])
        second = await http.post(answerer, json=retry, headers=close)
    body = second.json()
    assert "result" in body and not body["result"].get("isError"), second.text
    seen: dict[str, Any] = json.loads(body["result"]["content"][0]["text"])
    return seen


async def test_an_answer_lands_on_any_worker_and_with_a_state_key_on_the_face_started_again(
    stack: Stack, tmp_path: Path
) -> None:
    # Two workers share the port; each request on a new connection goes to either, so a retry sealed
    # by one is opened by the other about half the time: every round must resume the call.
    args = [*stack.face_args("alice"), "--workers", "2"]
    with http_face(stack.server.url, tmp_path / "face-workers.log", *args) as endpoint:
        for i in range(8):
            seen = await _ask_then_answer(endpoint, endpoint, f"Round {i}?")
            assert seen["result"] == {"action": "accept", "content": {"ok": True}}, seen
    # The operator's key file: an answer outlives the face that asked (the ask waits on the bus).
    key = tmp_path / "face.key"
    args = [*stack.face_args("alice"), "--state-key", str(key)]
    close = {**_modern_headers("tools/call", "asks_confirm"), "Connection": "close"}
    with http_face(stack.server.url, tmp_path / "face-a.log", *args) as endpoint:
        async with httpx2.AsyncClient(timeout=60) as http:
            asked = (await http.post(endpoint, json=_modern_call(1, {"question": "Deploy?"}), headers=close)).json()
    assert asked["result"]["resultType"] == "input_required", asked
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    answers = {k: {"action": "accept", "content": {"ok": False}} for k in asked["result"]["inputRequests"]}
    retry = _modern_call(
        2, {"question": "Deploy?"}, inputResponses=answers, requestState=asked["result"]["requestState"]
    )
    with http_face(stack.server.url, tmp_path / "face-b.log", *args) as endpoint:
        async with httpx2.AsyncClient(timeout=60) as http:
            body = (await http.post(endpoint, json=retry, headers=close)).json()
    assert json.loads(body["result"]["content"][0]["text"])["result"] == {"action": "accept", "content": {"ok": False}}
    # A key file others may read is refused before the face starts, saying how to fix it.
    key.chmod(0o644)
    refused = meshctl_mcp(stack.server.url, *stack.face_args("alice"), "--state-key", str(key), "--list")
    assert refused.returncode != 0 and f"chmod 600 {key}" in refused.stderr, refused.stderr
