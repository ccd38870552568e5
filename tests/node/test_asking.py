"""Asking across the bus and detached calls (docs/bus.md, "Asking", "Detached calls") on a real node in
this process: a child's elicitation reaches the caller and its answer the child; a caller that cannot
answer makes the child see an error at once; answers checked; tasks kept, waited for, listed, cancelled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from runtime.calls.desk import CallSettings
from runtime.client import AskFrame, AskRefused, MeshClient, NodeRefused, TaskFailed, tool_result
from runtime.wire.asking import ANSWERS, DETACHED, FRAME_ASK, TASK, AnswerBody, TaskRecord, task_subject
from runtime.wire.callproto import CALL_ID, FRAME
from tests.support.fake_child import Behaviour, FakeChild, Script, echo
from tests.support.inproc import Mesh, code_of, module_folder, until

FAST = CallSettings(keepalive_s=0.05, tasks_max_bytes=4 * 1024 * 1024, object_cap_bytes=1_500_000)
GREET = "mesh.tool.alpha.greet"
CONFIRM = (
    "elicitation/create",
    {
        "message": "Delete 3 files?",
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    },
)


async def start(m: Mesh, tmp_path: Path, script: Script, timeout_ms: int = 3000, **behaviour: Any) -> FakeChild:
    script.modules["alpha"] = [Behaviour(**({"answer": echo} | behaviour))]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=timeout_ms), calls=FAST)
    await m.bundle_state("n1", "alpha/tools", "ready")
    return script.of("alpha")[0]


def child_saw(result: bytes) -> dict[str, Any]:
    """The response the child got to its own request (the fake child puts it in its result's text)."""
    seen: dict[str, Any] = json.loads(tool_result(result)["content"][0]["text"])
    return seen


# --- asking ---------------------------------------------------------------------------------------
async def test_an_elicitation_reaches_the_caller_and_its_answer_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, ask=CONFIRM)
    asked: list[AskFrame] = []

    async def on_ask(frame: AskFrame) -> dict[str, Any]:
        asked.append(frame)
        return {"action": "accept", "content": {"ok": True}}

    result = await MeshClient(m.nc).call(GREET, {}, timeout_s=5, on_ask=on_ask)
    assert child_saw(result)["result"] == {"action": "accept", "content": {"ok": True}}
    [frame] = asked
    assert frame.method == "elicitation/create" and frame.ask == 1
    assert json.loads(bytes(frame.params))["message"] == "Delete 3 files?"
    assert 0 < frame.timeout_ms <= 3000 and frame.answer.startswith("mesh.answer.n1.")
    meta = child.calls()[0]["params"]["_meta"]
    assert isinstance(meta["mesh/call"], int)  # the reference its requests copy


async def test_a_decline_and_an_error_reach_the_child_as_given(tmp_path: Path, m: Mesh, script: Script) -> None:
    await start(m, tmp_path, script, ask=CONFIRM)

    async def decline(frame: AskFrame) -> dict[str, Any]:
        return {"action": "decline"}

    async def refuse(frame: AskFrame) -> dict[str, Any]:
        raise AskRefused("this caller does no sampling", code=-32601)

    caller = MeshClient(m.nc)
    assert child_saw(await caller.call(GREET, {}, timeout_s=5, on_ask=decline))["result"] == {"action": "decline"}
    seen = child_saw(await caller.call(GREET, {}, timeout_s=5, on_ask=refuse))
    assert seen["error"] == {"code": -32601, "message": "this caller does no sampling"}


async def test_a_caller_that_cannot_answer_makes_the_child_see_an_error_at_once(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await start(m, tmp_path, script, ask=CONFIRM)
    with anyio.fail_after(2):  # at once, not at the call's deadline
        result = await MeshClient(m.nc).call(GREET, {}, timeout_s=30)
    error = child_saw(result)["error"]
    assert error["code"] == -32601 and "cannot answer" in error["message"] and "Mesh-Answers" in error["message"]


async def test_a_request_naming_no_call_while_several_are_in_flight_is_refused_saying_why(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await start(m, tmp_path, script, ask=CONFIRM, ask_ref=False)

    async def on_ask(frame: AskFrame) -> dict[str, Any]:
        return {"action": "accept", "content": {"ok": True}}

    caller = MeshClient(m.nc)
    results: list[bytes] = []

    async def one() -> None:
        results.append(await caller.call(GREET, {}, timeout_s=5, on_ask=on_ask))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    messages = [child_saw(r).get("error", {}).get("message", "") for r in results]
    assert any("names no call" in text and "mesh/call" in text for text in messages), messages
    # One call alone needs no reference: the node knows which it is.
    assert child_saw(await caller.call(GREET, {}, timeout_s=5, on_ask=on_ask))["result"]["action"] == "accept"


async def test_answers_are_checked_and_a_call_that_ends_answers_its_waiting_ask(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, ask=CONFIRM, timeout_ms=600)
    reply = m.nc.new_inbox()
    sub = await m.nc.subscribe(reply)
    call_id = "answer-check-0123456789"
    await m.nc.publish(GREET, b"{}", reply=reply, headers={CALL_ID: call_id, ANSWERS: "1"})
    frame_msg = await sub.next_msg(timeout=2)
    assert (frame_msg.headers or {}).get(FRAME) == FRAME_ASK
    frame = msgspec.json.decode(frame_msg.data, type=AskFrame)
    for bad, why in (
        (b"not json", "must be"),
        (b'{"result": {}, "error": {"code": 1, "message": "x"}}', "exactly one"),
        (b'{"result": [1]}', "JSON object"),
        (b"{" + b'"result": {"x": "' + b"y" * 300_000 + b'"}}', "at most"),
    ):
        got = await m.nc.request(frame.answer, bad, timeout=2)
        assert code_of(got) == "400" and why in json.loads(got.data)["error"]["message"], (bad[:40], got.data[:200])
    wrong = frame.answer.rsplit(".", 1)[0] + ".9"
    got = await m.nc.request(wrong, msgspec.json.encode(AnswerBody(result=msgspec.Raw(b"{}"))), timeout=2)
    assert code_of(got) == "404"
    # Nobody answers: the call's deadline ends it, and the child's request is answered, not left hanging.
    final = await sub.next_msg(timeout=3)
    assert code_of(final) == "504"
    await until(lambda: child.responses, "the child's request answered")
    assert "ended before its caller answered" in child.responses[0]["error"]["message"]
    late = await m.nc.request(frame.answer, msgspec.json.encode(AnswerBody(result=msgspec.Raw(b"{}"))), timeout=2)
    assert code_of(late) == "404"


async def test_answers_need_a_call_id() -> None:
    from runtime.wire.callproto import parse_headers
    from runtime.wire.errors import BadRequest

    with pytest.raises(BadRequest, match="needs a Mesh-Call-Id"):
        parse_headers(GREET, {ANSWERS: "1"}, False)
    with pytest.raises(BadRequest, match="must be 1"):
        parse_headers(GREET, {DETACHED: "yes", CALL_ID: "x" * 20}, False)


# --- detached calls -------------------------------------------------------------------------------
async def test_a_detached_call_answers_at_once_and_its_result_waits_in_its_task(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await start(m, tmp_path, script, call_seconds=0.5)
    caller = MeshClient(m.nc)
    with anyio.fail_after(0.4):
        record = await caller.start(GREET, {"n": 1})
    assert record.state == "working" and record.node == "n1" and record.subject == GREET
    assert (await caller.task(record.task)).state == "working"
    done = await caller.task_result(record.task, wait_s=5)
    assert done.state == "completed"
    assert tool_result(await caller.result_of(done))["content"][0]["text"] == 'greet: {"n": 1}'
    page = await caller.tasks()
    assert [t.task for t in page.tasks] == [record.task] and page.next_cursor is None


async def test_the_handle_reply_names_the_task(tmp_path: Path, m: Mesh, script: Script) -> None:
    await start(m, tmp_path, script)
    call_id = "detached-handle-0123456"
    msg = await m.nc.request(GREET, b"{}", headers={CALL_ID: call_id, DETACHED: "1"}, timeout=2)
    assert (msg.headers or {}).get(TASK) == call_id
    assert msgspec.json.decode(msg.data, type=TaskRecord).task == call_id


async def test_a_task_cancel_reaches_the_child_and_the_record_says_cancelled(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, call_seconds=30, timeout_ms=60_000)
    caller = MeshClient(m.nc)
    record = await caller.start(GREET, {})
    await until(child.calls, "the call reached the child")
    cancelled = await caller.cancel(record.task)
    assert cancelled.state == "cancelled"
    cancels = await until(child.cancels, "the cancel reached the child")
    assert cancels[0]["requestId"] == child.calls()[0]["id"]
    final = await caller.task_result(record.task, wait_s=2)
    assert final.state == "cancelled"
    with pytest.raises(TaskFailed):
        await caller.result_of(final)


async def test_a_failed_detached_call_keeps_its_error_and_a_large_result_is_parked(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    def answer(tool: str, arguments: dict[str, Any]) -> Any:
        if "bytes" not in arguments:
            return Exception(-32603, "the tool broke")
        return {"content": [{"type": "text", "text": "x" * arguments["bytes"]}]}

    await start(m, tmp_path, script, answer=answer, timeout_ms=3000)
    caller = MeshClient(m.nc)
    big = await caller.task_result((await caller.start(GREET, {"bytes": 1_200_000})).task, wait_s=5)
    assert big.state == "completed" and big.result_object is not None and not big.result
    assert len(tool_result(await caller.result_of(big))["content"][0]["text"]) == 1_200_000
    failed = await caller.task_result((await caller.start(GREET, {"wrong": 1})).task, wait_s=5)
    assert failed.state == "failed" and failed.error is not None and failed.error.code == 500


async def test_task_requests_are_checked(tmp_path: Path, m: Mesh, script: Script) -> None:
    await start(m, tmp_path, script)
    caller = MeshClient(m.nc)
    with pytest.raises(NodeRefused) as e:
        await caller.task("no-such-task-0123456789")
    assert e.value.code == 404
    for body, field in ((b"{}", "task"), (b'{"task": "bad id"}', "task"), (b'{"task": "x", "more": 1}', "more")):
        got = await m.nc.request(task_subject("get"), body, timeout=2)
        assert code_of(got) == "400" and field in json.loads(got.data)["error"]["message"]
    got = await m.nc.request(task_subject("result"), b'{"task": "abcdefghijklmnopqrst", "wait_ms": 600000}', timeout=2)
    assert code_of(got) == "400" and "wait_ms" in json.loads(got.data)["error"]["message"]


async def test_a_detached_call_that_asks_says_input_required_and_takes_its_answer(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await start(m, tmp_path, script, ask=CONFIRM)
    caller = MeshClient(m.nc)
    record = await caller.start(GREET, {}, answers=True)
    waiting = await caller.task_result(record.task, wait_s=5)
    assert waiting.state == "input_required" and waiting.ask is not None, waiting
    assert waiting.ask.method == "elicitation/create"

    async def on_ask(frame: AskFrame) -> dict[str, Any]:
        return {"action": "accept", "content": {"ok": False}}

    done = await caller.task_result(record.task, wait_s=5, on_ask=on_ask)
    assert done.state == "completed"
    assert child_saw(await caller.result_of(done))["result"]["content"] == {"ok": False}
