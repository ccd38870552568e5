"""The bus call protocol (docs/bus.md) on a real node in this process: deadlines, cancels, progress
and keepalive frames, results and requests through the object store, bad Mesh-* headers.

Ported from tests/test_bus_calls.py, which keeps running it against a node process and the raw child.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from runtime.calls.desk import CallSettings
from runtime.calls.objects import put_request
from runtime.client import MeshClient, NodeRefused, tool_result
from runtime.wire.callproto import (
    CALL_ID,
    FRAME,
    OBJECT_SHA256,
    OBJECT_SIZE,
    PROGRESS,
    REQUEST_OBJECT,
    RESULT_OBJECT,
    TIMEOUT_MS,
    ProgressFrame,
)
from runtime.wire.subjects import cancel_subject, fetch_subject
from tests.support.fake_child import Behaviour, FakeChild, Script, echo
from tests.support.inproc import Mesh, code_of, module_folder, until

KEEPALIVE_S = 0.05
CAP = 1_500_000
FAST = CallSettings(keepalive_s=KEEPALIVE_S, object_cap_bytes=CAP)
GREET = "mesh.tool.alpha.greet"


def big(size: int) -> Any:
    def answer(tool: str, arguments: dict[str, Any]) -> Any:
        return {"content": [{"type": "text", "text": "x" * arguments.get("bytes", size)}]}

    return answer


async def start(m: Mesh, tmp_path: Path, script: Script, timeout_ms: int = 2000, **behaviour: Any) -> FakeChild:
    """Node n1 serving module alpha, its child behaving as told; the child, once ready."""
    script.modules["alpha"] = [Behaviour(**({"answer": echo} | behaviour))]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=timeout_ms), calls=FAST)
    await m.bundle_state("n1", "alpha/tools", "ready")
    return script.of("alpha")[0]


async def settled(m: Mesh, answered: int) -> None:
    """Every call has been answered (or dropped) by the node, and whatever it sent has reached this
    client: the status reply comes after it, on the same two connections."""
    await until(lambda: _settled(m, answered), f"{answered} calls answered")


async def _settled(m: Mesh, answered: int) -> bool:
    status = await m.status("n1")
    return status.in_flight == 0 and status.answered == answered


async def inbox(m: Mesh) -> tuple[str, Subscription]:
    reply = m.nc.new_inbox()
    return reply, await m.nc.subscribe(reply)


def error(msg: Any) -> dict[str, Any]:
    return json.loads(msg.data)["error"]


# --- deadlines --------------------------------------------------------------------------------------
async def test_a_callers_shorter_deadline_is_504_naming_the_caller_and_the_child_is_told(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, call_seconds=5)
    [msg] = await m.frames(GREET, {}, {TIMEOUT_MS: "100"})
    assert code_of(msg) == "504"
    e = error(msg)
    assert (e["deadline"], e["timeout_ms"], e["waited_for"]) == ("caller", 100, "child") and "caller's deadline" in e[
        "message"
    ]
    assert child.cancels() == [{"requestId": child.calls()[0]["id"], "reason": "timed out after 100 ms"}]


async def test_a_deadline_longer_than_the_bundles_timeout_does_not_lengthen_it(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await start(m, tmp_path, script, timeout_ms=150, call_seconds=5)
    [msg] = await m.frames(GREET, {}, {TIMEOUT_MS: "60000"})
    assert code_of(msg) == "504"
    assert (error(msg)["deadline"], error(msg)["timeout_ms"]) == ("bundle", 150)


# --- cancels ----------------------------------------------------------------------------------------
async def test_a_cancel_reaches_the_child_with_its_reason_and_nothing_is_answered(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, call_seconds=30)
    call_id = "cancel-test-0123456789ab"
    reply, sub = await inbox(m)
    await m.nc.publish(GREET, b'{"held": 1}', reply=reply, headers={CALL_ID: call_id})
    await until(child.calls, "the call reached the child")
    await m.nc.publish(cancel_subject(call_id), b'{"reason": "user pressed stop"}')
    cancels = await until(child.cancels, "the cancel reached the child")
    assert cancels == [{"requestId": child.calls()[0]["id"], "reason": "user pressed stop"}]
    await settled(m, answered=1)
    assert sub.pending_msgs == 0, "a cancelled call was answered"
    assert m.nodes["n1"].serving.desk.stats() == {"open": 0, "cancels_honoured": 1, "cancels_ignored": 0}  # type: ignore[union-attr]
    assert child.running  # a cancel is not a restart


async def test_a_cancel_of_an_answered_call_does_nothing(tmp_path: Path, m: Mesh, script: Script) -> None:
    child = await start(m, tmp_path, script)
    call_id = "answered-0123456789abcd"
    [msg] = await m.frames(GREET, {"a": 1}, {CALL_ID: call_id})
    assert code_of(msg) is None
    await m.nc.publish(cancel_subject(call_id), b"")
    desk = m.nodes["n1"].serving.desk  # type: ignore[union-attr]
    await until(
        lambda: any(key[1] == call_id for key in desk._early),
        "the cancel was taken in (remembered, in case its call comes)",
    )
    assert child.cancels() == [] and desk.cancels_honoured == 0
    [msg] = await m.frames(GREET, {"again": 1}, {CALL_ID: "answered-next-0123456789"})
    assert code_of(msg) is None and "again" in json.loads(msg.data)["content"][0]["text"]


async def test_a_cancel_that_overtakes_its_request_still_cancels_it_before_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script)
    call_id = "early-cancel-0123456789"
    await m.nc.publish(cancel_subject(call_id), b"")
    desk = m.nodes["n1"].serving.desk  # type: ignore[union-attr]
    await until(lambda: any(key[1] == call_id for key in desk._early), "the early cancel was taken in")
    reply, sub = await inbox(m)
    await m.nc.publish(GREET, b'{"early": 1}', reply=reply, headers={CALL_ID: call_id})
    await settled(m, answered=1)
    assert sub.pending_msgs == 0, "a call cancelled before it came was answered"
    assert child.calls() == [], "a call cancelled before it came reached the child"
    assert desk.cancels_honoured == 1


async def test_a_second_call_with_an_id_in_flight_is_400(tmp_path: Path, m: Mesh, script: Script) -> None:
    child = await start(m, tmp_path, script, call_seconds=30)
    call_id = "twice-0123456789abcdef"
    await m.nc.publish(GREET, b"{}", reply=m.nc.new_inbox(), headers={CALL_ID: call_id})
    await until(child.calls, "the first call reached the child")
    [msg] = await m.frames(GREET, {}, {CALL_ID: call_id})
    assert (
        code_of(msg) == "400"
        and "already in flight" in error(msg)["message"]
        and error(msg)["field"] == "header Mesh-Call-Id"
    )
    assert len(child.calls()) == 1


async def test_a_client_call_cancelled_by_its_scope_is_cancelled_in_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, call_seconds=30)
    caller = MeshClient(m.nc)
    async with anyio.create_task_group() as tg:
        tg.start_soon(caller.call, GREET, {"held": True})
        await until(child.calls, "the call reached the child")
        tg.cancel_scope.cancel()
    reasons = await until(child.cancels, "the cancel reached the child")
    assert reasons[0]["reason"] == "the caller cancelled the call"
    with pytest.raises(NodeRefused) as refused:
        await caller.call("mesh.tool.alpha.nope", {})
    assert refused.value.code == 404
    await caller.close()


# --- progress and keepalives --------------------------------------------------------------------------
async def test_progress_frames_arrive_in_order_and_only_when_asked(tmp_path: Path, m: Mesh, script: Script) -> None:
    child = await start(m, tmp_path, script, progress=20)
    got = await m.frames(GREET, {}, {PROGRESS: "1"})
    frames = [json.loads(f.data) for f in got if (f.headers or {}).get(FRAME) == "progress"]
    assert frames == [{"progress": i, "total": 20, "message": f"step {i}"} for i in range(1, 21)]
    assert code_of(got[-1]) is None and FRAME not in (got[-1].headers or {})
    assert isinstance(child.calls()[0]["params"]["_meta"]["progressToken"], int)
    # Without the header: no token for the child, one message back (a call id alone asks for none).
    for headers in (None, {CALL_ID: "no-progress-0123456789"}):
        got = await m.frames(GREET, {}, headers)
        assert len(got) == 1 and code_of(got[0]) is None
        assert "progressToken" not in (child.calls()[-1]["params"].get("_meta") or {})


async def test_a_progress_notification_with_a_token_nobody_was_given_goes_nowhere(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, call_seconds=0.2)
    reply, sub = await inbox(m)
    await m.nc.publish(GREET, b"{}", reply=reply, headers={PROGRESS: "1"})
    [call] = await until(child.calls, "the call reached the child")
    token = call["params"]["_meta"]["progressToken"]
    for forged in (token + 1, str(token), None):
        child.notify("notifications/progress", {"progressToken": forged, "progress": 99})
    child.notify("notifications/progress", {"progressToken": token, "progress": 1})
    msgs: list[Msg] = []
    while not msgs or FRAME in (msgs[-1].headers or {}):
        msgs.append(await sub.next_msg(timeout=5))
    progress = [json.loads(f.data) for f in msgs if (f.headers or {}).get(FRAME) == "progress"]
    assert progress == [{"progress": 1}]


async def test_errors_of_a_call_with_progress_are_the_same_errors(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["alpha"] = [
        Behaviour(answer=echo, call_seconds=5, tools=("greet", "typed"), schemas={"typed": {"required": ["n"]}})
    ]
    await m.start("n1", module_folder(tmp_path, "alpha"), calls=FAST)
    got = await m.frames("mesh.tool.alpha.nope", {}, {PROGRESS: "1"})
    assert code_of(got[-1]) == "404"
    got = await m.frames(GREET, {}, {PROGRESS: "1", TIMEOUT_MS: "100"})
    assert code_of(got[-1]) == "504" and error(got[-1])["deadline"] == "caller"
    got = await m.frames("mesh.tool.alpha.typed", {}, {PROGRESS: "1"})
    assert code_of(got[-1]) == "400" and error(got[-1])["field"] == "n"


async def test_a_long_call_sends_keepalives_from_its_start(tmp_path: Path, m: Mesh, script: Script) -> None:
    await start(m, tmp_path, script, call_seconds=0.3)
    got = await m.frames(GREET, {}, {PROGRESS: "1"})
    keepalives = [json.loads(f.data) for f in got if (f.headers or {}).get(FRAME) == "keepalive"]
    assert len(keepalives) >= 2, keepalives
    assert keepalives[0]["elapsed_ms"] < 1000 * KEEPALIVE_S and {k["interval_ms"] for k in keepalives} == {50}
    assert [k["elapsed_ms"] for k in keepalives] == sorted(k["elapsed_ms"] for k in keepalives)
    assert code_of(got[-1]) is None and "greet" in json.loads(got[-1].data)["content"][0]["text"]


async def test_keepalives_flow_while_the_call_waits_for_its_bundle_to_start(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    gate = asyncio.get_running_loop().create_future()
    script.modules["alpha"] = [Behaviour(answer=echo, handshake_gate=gate)]
    await m.start("n1", module_folder(tmp_path, "alpha"), calls=FAST)
    reply, sub = await inbox(m)
    await m.nc.publish(GREET, b'{"waited": true}', reply=reply, headers={PROGRESS: "1"})
    for _ in range(2):  # the call waits for the start, the caller hears the node meanwhile
        frame = await sub.next_msg(timeout=5)
        assert (frame.headers or {}).get(FRAME) == "keepalive"
    assert (await m.status("n1")).bundle("alpha/tools").state == "starting"  # type: ignore[union-attr]
    gate.set_result(None)
    while FRAME in ((frame := await sub.next_msg(timeout=5)).headers or {}):
        pass
    assert code_of(frame) is None and json.loads(frame.data)["content"][0]["text"] == 'greet: {"waited": true}'


async def test_the_client_passes_progress_to_its_caller(tmp_path: Path, m: Mesh, script: Script) -> None:
    await start(m, tmp_path, script, progress=7)
    caller = MeshClient(m.nc, keepalive_s=KEEPALIVE_S)
    seen: list[ProgressFrame] = []
    result = tool_result(await caller.call(GREET, {"n": 7}, on_progress=seen.append))
    assert [f.progress for f in seen] == [1, 2, 3, 4, 5, 6, 7] and seen[-1].message == "step 7"
    assert result["content"][0]["text"] == 'greet: {"n": 7}'
    await caller.close()


# --- the object store ---------------------------------------------------------------------------------
async def test_a_result_larger_than_a_message_is_parked_and_read_back_through_the_node(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    size = 1_200_000  # the session's server carries 1 MiB
    await start(m, tmp_path, script, answer=big(size))
    [msg] = await m.frames(GREET, {})
    name = (msg.headers or {})[RESULT_OBJECT]
    ref = json.loads(msg.data)
    assert ref["bucket"] == "mesh-calls" and ref["name"] == name and ref["size"] > size, ref
    # Read back in chunks through any node, then a last message naming size and sha256.
    got = await m.frames(fetch_subject(name))
    data = b"".join(f.data for f in got[:-1])
    assert len(got) >= 3 and all((f.headers or {}).get(FRAME) == "chunk" for f in got[:-1])
    assert got[-1].headers is not None and int(got[-1].headers[OBJECT_SIZE]) == len(data) == ref["size"]
    assert got[-1].headers[OBJECT_SHA256] == hashlib.sha256(data).hexdigest() == ref["sha256"]
    assert json.loads(data)["content"][0]["text"] == "x" * size
    # The client resolves it without its caller knowing.
    caller = MeshClient(m.nc)
    result = tool_result(await caller.call(GREET, {}))
    assert result["content"][0]["text"] == "x" * size
    await caller.close()
    _, code = await m.call(GREET, {"bytes": 3})  # the child serves on
    assert code is None


async def test_a_result_past_the_cap_is_413_naming_the_cap(tmp_path: Path, m: Mesh, script: Script) -> None:
    await start(m, tmp_path, script, answer=big(CAP + 1000))
    [msg] = await m.frames(GREET, {})
    assert code_of(msg) == "413"
    assert error(msg)["cap"] == CAP and str(CAP) in error(msg)["message"]


@pytest.mark.parametrize("name", ["res.no-such-object-0123456789", "not-a-result-name", "res.short"])
async def test_fetching_an_object_that_is_not_there_is_404(tmp_path: Path, m: Mesh, script: Script, name: str) -> None:
    await start(m, tmp_path, script)
    [msg] = await m.frames(fetch_subject(name))
    assert code_of(msg) == "404" and "no result object" in error(msg)["message"]


async def test_a_request_larger_than_a_message_goes_through_the_object_store_and_is_deleted(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(
        m, tmp_path, script, answer=lambda tool, args: {"content": [{"type": "text", "text": str(len(args["blob"]))}]}
    )
    args = {"blob": "y" * 1_200_000}
    caller = MeshClient(m.nc)
    result = tool_result(await caller.call(GREET, args, timeout_s=30))
    assert result["content"][0]["text"] == "1200000"
    assert child.calls()[0]["params"]["arguments"] == args
    # The request object, once read, is deleted.
    store = await m.nc.jetstream().object_store("mesh-calls")
    try:
        names = [o.name for o in await store.list(ignore_deletes=True)]
    except NotFoundError:  # nats-py's word for an empty store
        names = []
    assert not [n for n in names if n.startswith("req.")], names
    await caller.close()


async def test_a_request_object_put_by_hand_is_read_once(tmp_path: Path, m: Mesh, script: Script) -> None:
    child = await start(m, tmp_path, script)
    name = await put_request(m.nc, b'{"from": "the store"}')
    [msg] = await m.frames(GREET, None, {REQUEST_OBJECT: name})
    assert code_of(msg) is None and child.calls()[0]["params"]["arguments"] == {"from": "the store"}
    store = await m.nc.jetstream().object_store("mesh-calls")
    with pytest.raises(NotFoundError):
        await store.get_info(name)
    [msg] = await m.frames(GREET, None, {REQUEST_OBJECT: name})  # gone: said so, never a second run
    assert code_of(msg) == "413" and "no such object" in error(msg)["message"]
    assert len(child.calls()) == 1


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
async def test_bad_headers_are_400_naming_the_header_and_never_reach_the_child(
    tmp_path: Path, m: Mesh, script: Script, headers: dict[str, str], named: str
) -> None:
    child = await start(m, tmp_path, script)
    [msg] = await m.frames(GREET, {"a": 1}, headers)
    assert code_of(msg) == "400"
    assert named in error(msg)["message"] and named in error(msg)["field"], error(msg)
    assert child.calls() == []


async def test_a_call_cancelled_while_its_request_object_is_read_is_never_begun(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script)
    name = await put_request(m.nc, b'{"late": 1}')
    call_id = "object-cancel-0123456789"
    await m.nc.publish(cancel_subject(call_id), b"")
    desk = m.nodes["n1"].serving.desk  # type: ignore[union-attr]
    await until(lambda: any(key[1] == call_id for key in desk._early), "the early cancel was taken in")
    reply, sub = await inbox(m)
    await m.nc.publish(GREET, b"", reply=reply, headers={CALL_ID: call_id, REQUEST_OBJECT: name})
    await settled(m, answered=1)
    assert sub.pending_msgs == 0 and child.calls() == []


async def test_a_large_result_of_a_call_without_a_reply_subject_is_not_parked(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    child = await start(m, tmp_path, script, answer=big(1_200_000))
    await m.nc.publish(GREET, b"{}")
    await settled(m, answered=1)
    assert len(child.calls()) == 1
    [msg] = await m.frames(GREET, {"bytes": 10})  # the bucket exists (or not): nothing in it either way
    assert code_of(msg) is None
    try:
        store = await m.nc.jetstream().object_store("mesh-calls")
        names = [o.name for o in await store.list()]
    except NotFoundError:  # no bucket, or nats-py's word for an empty one
        names = []
    assert names == [], "a result nobody can fetch was put into the object store"
