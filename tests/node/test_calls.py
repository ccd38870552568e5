"""A real node in this process: calls from the bus to (fake) children and back.

Ported from the end-to-end tests (tests/test_node.py, tests/faults/test_bad_input.py,
tests/faults/test_children.py, tests/faults/test_stop.py), which keep running real children.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from launcher.bundle import HealthPolicy
from runtime.hosting import children
from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder, until

TYPED = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"}},
    "required": ["name"],
    "additionalProperties": False,
}


def typed(script: Script, module: str = "alpha") -> None:
    script.modules[module] = [Behaviour(answer=echo, tools=("greet", "typed"), schemas={"typed": TYPED})]


async def test_a_call_reaches_the_child_and_its_result_comes_back(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    result, code = await m.call("mesh.tool.alpha.greet", {"name": "Ada"})
    assert code is None and result["content"][0]["text"] == 'greet: {"name": "Ada"}'


async def test_an_empty_body_is_an_empty_arguments_object(tmp_path: Path, m: Mesh, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    result, code = await m.call("mesh.tool.alpha.greet")
    assert code is None and result["content"][0]["text"] == "greet: {}"
    assert script.of("alpha")[-1].calls()[-1]["params"]["arguments"] == {}


async def test_an_unknown_module_is_404_naming_what_is_served(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.nope", {})
    assert code == "404" and "module alpha has no tool 'nope'" in body["error"]["message"]
    assert body["error"]["known"] == ["mesh.tool.alpha.greet"]


async def test_a_deeper_subject_under_a_module_is_404_and_a_module_nobody_serves_has_no_responders(
    tmp_path: Path, m: Mesh
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.greet.deeper", {})
    assert code == "404" and body["error"]["subject"] == "mesh.tool.alpha.greet.deeper", body
    for subject in ("mesh.tool.nobody.greet", "mesh.seat.nobody.get"):
        with pytest.raises(nats.errors.NoRespondersError):
            await m.nc.request(subject, b"{}", timeout=5)


async def test_a_body_that_is_not_an_object_is_400_and_never_reaches_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.greet", b"[1, 2]")
    assert code == "400" and "must be a JSON object" in body["error"]["message"]
    assert not [r for r in script.started[-1].received if r.get("method") == "tools/call"]


NOT_JSON = [b"{not json", b"\xff\xfe", b'{"a": 1} trailing', b"{", b"'single quotes'", b'{"a": 01}', b"NaN"]
NOT_AN_OBJECT = [b"[1, 2]", b'"text"', b"42", b"null", b"true", b"[]"]


async def test_bodies_that_are_not_json_or_not_an_object_are_400_each_saying_which(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for raw in NOT_JSON:
        body, code = await m.call("mesh.tool.alpha.greet", raw)
        assert code == "400" and body["error"]["kind"] == "bad_request", (raw, body)
        assert "not valid JSON" in body["error"]["message"], (raw, body)
    for raw in NOT_AN_OBJECT:
        body, code = await m.call("mesh.tool.alpha.greet", raw)
        assert code == "400" and "must be a JSON object" in body["error"]["message"], (raw, body)
    # The Service API headers carry the same, on the reply itself.
    msg = await m.nc.request("mesh.tool.alpha.greet", b"{nope", timeout=5)
    assert msg.headers and msg.headers["Nats-Service-Error-Code"] == "400"
    assert "not valid JSON" in msg.headers["Nats-Service-Error"]
    assert script.of("alpha")[-1].calls() == []
    result, code = await m.call("mesh.tool.alpha.greet", {" ok ": "\u00e9\u4e2d\U0001f600"})
    assert code is None and "\\u00e9" in result["content"][0]["text"]


async def test_invalid_utf8_inside_a_string_is_400_and_the_child_is_untouched(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.greet", b'{"name": "\xff\xfe"}')
    assert code == "400" and "not UTF-8" in body["error"]["message"], body
    assert len(script.of("alpha")) == 1 and script.of("alpha")[0].calls() == []


async def test_deeply_nested_arguments_are_400_not_a_crash(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    depth = 100_000
    body, code = await m.call("mesh.tool.alpha.greet", b'{"deep": ' + b"[" * depth + b"]" * depth + b"}")
    assert code == "400", body
    _, code = await m.call("mesh.tool.alpha.greet", {})
    assert code is None


TYPED_CASES = [
    ({}, "name", "required argument 'name' is missing"),
    ({"count": 1}, "name", "required argument 'name' is missing"),
    ({"name": 5}, "name", "is an integer; it must be string"),
    ({"name": None}, "name", "is a null; it must be string"),
    ({"name": ["a"]}, "name", "is an array; it must be string"),
    ({"name": {"first": "a"}}, "name", "is an object; it must be string"),
    ({"name": True}, "name", "is a boolean; it must be string"),
    ({"name": "a", "count": 1.5}, "count", "is a number; it must be integer"),
    ({"name": "a", "count": "3"}, "count", "is a string; it must be integer"),
    ({"name": "a", "ratio": "0.5"}, "ratio", "is a string; it must be number"),
    ({"name": "a", "colour": "red"}, "colour", "unknown argument 'colour'"),
]


async def test_arguments_failing_the_input_schema_are_400_naming_the_field_and_never_reach_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    typed(script)
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for args, field, text in TYPED_CASES:
        body, code = await m.call("mesh.tool.alpha.typed", args)
        assert code == "400", (args, body)
        assert body["error"]["field"] == field and text in body["error"]["message"], (args, body)
        assert body["error"]["subject"] == "mesh.tool.alpha.typed"
    _, code = await m.call("mesh.tool.alpha.typed")  # an empty body is {}: `name` is still missing
    assert code == "400"
    assert script.of("alpha")[0].calls() == []
    good = [{"name": "a"}, {"name": "a", "count": -3, "ratio": 1}, {"name": "", "ratio": -2.5e-3}]
    for args in good:
        _, code = await m.call("mesh.tool.alpha.typed", args)
        assert code is None, args
    assert [c["params"]["arguments"] for c in script.of("alpha")[0].calls()] == good


async def test_integers_written_with_a_fraction_or_an_exponent_pass_the_schema_check(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    typed(script)
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for raw in (b'{"name": "a", "count": 2.0}', b'{"name": "a", "count": 1e2}'):
        body, code = await m.call("mesh.tool.alpha.typed", raw)
        assert code is None, (raw, body)


async def test_the_childs_json_rpc_errors_become_400_404_and_500(tmp_path: Path, m: Mesh, script: Script) -> None:
    errors = {"refuse": Exception(-32602, "x must be positive"), "unknown": Exception(-32601, "no such tool")}

    def answer(tool: str, arguments: dict[str, Any]) -> Any:
        return errors.get(tool, Exception(-32000, "disk full"))

    script.modules["alpha"] = [Behaviour(answer=answer, tools=("refuse", "unknown", "broken"))]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.refuse", {})
    assert code == "400" and "the tool refused its arguments: x must be positive" in body["error"]["message"]
    body, code = await m.call("mesh.tool.alpha.unknown", {})
    assert code == "404" and "the bundle does not know this tool" in body["error"]["message"]
    body, code = await m.call("mesh.tool.alpha.broken", {})
    assert code == "500" and "JSON-RPC error -32000: disk full" in body["error"]["message"]
    assert (await m.bundle_state("n1", "alpha/tools", "ready")).bundle("alpha/tools").restarts == 0  # type: ignore[union-attr]


async def test_200_concurrent_calls_on_one_child_each_get_their_own_answer(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    results = await asyncio.gather(*(m.call("mesh.tool.alpha.greet", {"i": i}) for i in range(200)))
    for i, (result, code) in enumerate(results):
        assert code is None and result["content"][0]["text"] == f'greet: {{"i": {i}}}'
    bundle = (await m.status("n1")).bundle("alpha/tools")
    assert bundle is not None and bundle.calls == 200 and bundle.restarts == 0


async def test_a_bundle_that_cannot_start_is_503_naming_it_and_the_others_serve(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["broken"] = [Behaviour(unstartable=True)]
    await m.start("n1", module_folder(tmp_path, "alpha"), module_folder(tmp_path, "broken"))
    await m.bundle_state("n1", "broken/tools", "failed")
    body, code = await m.call("mesh.tool.broken.greet", {})
    assert code == "503" and body["error"]["bundle"] == "broken/tools" and body["error"]["state"] == "failed", body
    result, code = await m.call("mesh.tool.alpha.greet", {})
    assert code is None and "greet" in json.dumps(result)


async def test_a_crash_loop_ends_failed_naming_the_exit_and_what_it_said(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["broken"] = [Behaviour(exit_after=0, stderr="the configuration is missing")]
    await m.start("n1", module_folder(tmp_path, "broken"), module_folder(tmp_path, "alpha"))
    status = await m.bundle_state("n1", "broken/tools", "failed")
    failed = status.bundle("broken/tools")
    assert failed is not None and failed.restarts == 3 and failed.last_exit == "exit code 1", failed
    assert "the configuration is missing" in failed.stderr_tail
    body, code = await m.call("mesh.tool.broken.greet", {})
    assert code == "503" and body["error"]["last_exit"] == "exit code 1"
    assert body["error"]["stderr_tail"] == ["the configuration is missing"] * 4
    assert any("meshctl node restart broken/tools --name n1" in w for w in body["error"]["ways_out"])
    _, code = await m.call("mesh.tool.alpha.greet", {})
    assert code is None


async def test_a_child_without_the_handshake_ends_failed_naming_it(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["mute"] = [Behaviour(handshake=False)]
    health = HealthPolicy(init_timeout_s=0.05, stop_grace_s=0.1)
    await m.start("n1", module_folder(tmp_path, "mute"), health=health)
    failed = (await m.bundle_state("n1", "mute/tools", "failed")).bundle("mute/tools")
    assert failed is not None and "did not complete the MCP handshake" in (failed.last_error or "")
    assert "initialize" in (failed.last_error or "")
    body, code = await m.call("mesh.tool.mute.anything", {})
    assert code == "503" and body["error"]["state"] == "failed"


async def test_a_child_killed_mid_call_is_503_at_once_then_it_serves_again(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, call_seconds=30), Behaviour(answer=echo)]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=20000))
    first = await m.bundle_state("n1", "alpha/tools", "ready")
    pending = asyncio.create_task(m.call("mesh.tool.alpha.greet", {"held": True}, timeout=20))
    child = script.of("alpha")[0]
    await until(child.calls, "the call reached the child")
    child.kill()
    body, code = await asyncio.wait_for(pending, 2)
    assert code == "503", body
    error = body["error"]
    assert error["bundle"] == "alpha/tools" and error["module"] == "alpha" and "SIGKILL" in error["last_exit"]
    assert error["ways_out"]
    again = (await m.bundle_state("n1", "alpha/tools", "ready")).bundle("alpha/tools")
    assert again is not None and again.pid != first.bundle("alpha/tools").pid and again.restarts == 1  # type: ignore[union-attr]
    result, code = await m.call("mesh.tool.alpha.greet", {"after": "restart"})
    assert code is None and "after" in result["content"][0]["text"]


async def test_a_call_past_the_bundles_timeout_is_504_and_the_child_is_told(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["slow"] = [Behaviour(answer=echo, call_seconds=5)]
    await m.start("n1", module_folder(tmp_path, "slow", timeout_ms=200))
    body, code = await m.call("mesh.tool.slow.greet", {})
    assert code == "504" and body["error"]["timeout_ms"] == 200 and body["error"]["waited_for"] == "child"
    cancelled = [r for r in script.started[-1].received if r.get("method") == "notifications/cancelled"]
    assert len(cancelled) == 1


async def test_a_call_arriving_while_its_bundle_starts_rides_over_the_start(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    gate = asyncio.get_running_loop().create_future()
    script.modules["late"] = [Behaviour(answer=echo, handshake_gate=gate)]
    await m.start("n1", module_folder(tmp_path, "late"))
    assert (await m.status("n1")).bundle("late/tools").state == "starting"  # type: ignore[union-attr]
    pending = asyncio.create_task(m.call("mesh.tool.late.greet", {"waited": True}))
    await until(lambda: _in_flight(m, 1), "the call waiting for the start")
    assert script.of("late")[0].calls() == []
    gate.set_result(None)  # the child starts
    result, code = await pending
    assert code is None and result["content"][0]["text"] == 'greet: {"waited": true}'


async def _in_flight(m: Mesh, calls: int) -> bool:
    return (await m.status("n1")).in_flight == calls


async def test_a_start_longer_than_the_calls_timeout_is_504_saying_it_waited_for_the_start(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    gate = asyncio.get_running_loop().create_future()  # never done: the start outlasts the call
    script.modules["late"] = [Behaviour(answer=echo, handshake_gate=gate)]
    await m.start("n1", module_folder(tmp_path, "late", timeout_ms=100))
    body, code = await m.call("mesh.tool.late.greet", {})
    assert code == "504" and body["error"]["waited_for"] == "start", body
    assert "never reached the child" in body["error"]["message"]
    assert script.of("late")[0].calls() == []


async def test_a_call_finding_every_slot_and_the_queue_full_is_503_overloaded_at_once(
    tmp_path: Path, m: Mesh, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The queue's bound, made small: a bundle of max_in_flight 1 with room for 2 calls waiting.
    spec_of = children.runner_spec
    monkeypatch.setattr("runtime.node.modules.runner_spec", lambda *a: dataclasses.replace(spec_of(*a), max_waiting=2))
    script.modules["busy"] = [Behaviour(answer=echo, call_seconds=30)]
    await m.start("n1", module_folder(tmp_path, "busy", timeout_ms=10000, bundle="max_in_flight = 1"))
    held = [asyncio.create_task(m.call("mesh.tool.busy.greet", {"i": i}, timeout=10)) for i in range(3)]
    await until(script.of("busy")[0].calls, "the first call reached the child")
    body, code = await m.call("mesh.tool.busy.greet", {"one": "more"})
    assert code == "503" and body["error"]["kind"] == "overloaded", body
    assert (body["error"]["in_flight"], body["error"]["limit"], body["error"]["waiting"]) == (1, 1, 2)
    assert any("max_in_flight" in w for w in body["error"]["ways_out"])
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_a_publish_without_a_reply_subject_runs_and_is_counted(tmp_path: Path, m: Mesh, script: Script) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.nc.publish("mesh.tool.alpha.greet", b'{"fire": "forget"}')
    child = script.of("alpha")[0]
    await until(child.calls, "the published call reached the child")
    assert child.calls()[0]["params"]["arguments"] == {"fire": "forget"}
    await until(lambda: _answered(m), "the call counted as answered")


async def _answered(m: Mesh) -> bool:
    status = await m.status("n1")
    return status.answered == 1 and status.in_flight == 0


async def test_a_clean_stop_answers_the_calls_in_flight_then_nobody_serves(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, call_seconds=0.2)]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=10000), drain_timeout_s=10)
    calls = [asyncio.create_task(m.call("mesh.tool.alpha.greet", {"i": i}, timeout=10)) for i in range(20)]
    child = script.of("alpha")[0]
    await until(lambda: len(child.calls()) == 20, "20 calls in the child")
    await m.stop("n1")
    results = await asyncio.gather(*calls)
    assert [code for _, code in results] == [None] * 20
    assert not child.running
    with pytest.raises(nats.errors.NoRespondersError):
        await m.nc.request("mesh.tool.alpha.greet", b"{}", timeout=5)


async def test_calls_left_after_the_drain_timeout_are_503_node_stopping_and_cancelled_in_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, call_seconds=30)]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=30000), drain_timeout_s=0.05)
    calls = [asyncio.create_task(m.call("mesh.tool.alpha.greet", {"i": i}, timeout=10)) for i in range(5)]
    child = script.of("alpha")[0]
    await until(lambda: len(child.calls()) == 5, "5 calls in the child")
    await m.stop("n1")
    results = await asyncio.gather(*calls)
    assert [code for _, code in results] == ["503"] * 5
    assert all(body["error"]["kind"] == "node_stopping" for body, _ in results)
    assert "node n1 stopped before the call finished" in results[0][0]["error"]["message"]
    assert len(child.cancels()) == 5


async def test_a_child_writing_garbage_on_stdout_is_served(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["noisy"] = [Behaviour(answer=echo, garbage_every=0.001)]
    await m.start("n1", module_folder(tmp_path, "noisy"))
    results = await asyncio.gather(*(m.call("mesh.tool.noisy.greet", {"i": i}) for i in range(50)))
    assert all(code is None and f'"i": {i}' in r["content"][0]["text"] for i, (r, code) in enumerate(results))
    assert (await m.status("n1")).bundle("noisy/tools").restarts == 0  # type: ignore[union-attr]


async def test_the_node_starts_when_every_bundle_fails(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["one"] = [Behaviour(unstartable=True)]
    script.modules["two"] = [Behaviour(exit_after=0)]
    await m.start("n1", module_folder(tmp_path, "one"), module_folder(tmp_path, "two"))
    await m.bundle_state("n1", "one/tools", "failed")
    status = await m.bundle_state("n1", "two/tools", "failed")
    assert sorted(mod.name for mod in status.modules) == ["one", "two"]
    assert "cannot start" in (status.bundle("one/tools").last_error or "")  # type: ignore[union-attr]


async def test_a_child_that_stops_answering_ping_is_killed_and_started_again(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["deaf"] = [Behaviour(answer=echo, answers_ping=False), Behaviour(answer=echo)]
    health = HealthPolicy(
        init_timeout_s=0.5, ping_interval_s=0.02, ping_timeout_s=0.02, ping_misses=2, stop_grace_s=0.1
    )
    await m.start("n1", module_folder(tmp_path, "deaf"), health=health)
    await until(lambda: len(script.of("deaf")) == 2, "a second child")
    first = script.of("deaf")[0]
    assert not first.running and first.exited.result() == -9
    again = (await m.bundle_state("n1", "deaf/tools", "ready")).bundle("deaf/tools")
    assert (
        again is not None and again.restarts == 1 and "stopped answering ping (2 x 0.02 s)" in (again.last_error or "")
    )
    _, code = await m.call("mesh.tool.deaf.greet", {})
    assert code is None


async def test_a_call_with_a_reply_and_one_without_mixed_under_load_are_each_run_once(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for i in range(50):
        await m.nc.publish("mesh.tool.alpha.greet", json.dumps({"fire": i}).encode())
    answered = await asyncio.gather(*(m.call("mesh.tool.alpha.greet", {"ask": i}) for i in range(50)))
    assert all(code is None for _, code in answered)
    child = script.of("alpha")[0]
    await until(lambda: len(child.calls()) == 100, "every call in the child")
    args = [c["params"]["arguments"] for c in child.calls()]
    assert sorted(a.get("fire", -1) for a in args if "fire" in a) == list(range(50))
    assert sorted(a["ask"] for a in args if "ask" in a) == list(range(50))


async def test_calls_waiting_for_a_start_or_a_slot_when_the_node_stops_are_503_node_stopping_at_once(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    gate = asyncio.get_running_loop().create_future()  # never done: "late" never starts
    script.modules["late"] = [Behaviour(answer=echo, handshake_gate=gate)]
    script.modules["busy"] = [Behaviour(answer=echo, call_seconds=30)]
    busy = module_folder(tmp_path, "busy", timeout_ms=30000, bundle="max_in_flight = 1")
    patient = HealthPolicy(init_timeout_s=30, ping_interval_s=30, stop_grace_s=0.1)  # the start is not given up
    await m.start("n1", module_folder(tmp_path, "late", timeout_ms=30000), busy, drain_timeout_s=0.05, health=patient)
    await m.bundle_state("n1", "busy/tools", "ready")
    calls = [asyncio.create_task(m.call("mesh.tool.late.greet", {}, timeout=20))]
    calls += [asyncio.create_task(m.call("mesh.tool.busy.greet", {"i": i}, timeout=20)) for i in range(4)]
    await until(
        lambda: _in_flight(m, 5), "five calls in flight: one started, three waiting for its slot, one for a start"
    )
    loop = asyncio.get_running_loop()
    stopped_at = loop.time()
    await m.stop("n1")
    results = await asyncio.gather(*calls)
    assert loop.time() - stopped_at < 5, "the stop waited out a call's timeout"
    assert [(code, body["error"]["kind"]) for body, code in results] == [("503", "node_stopping")] * 5
    assert len(script.of("busy")[0].calls()) == 1, "a call waiting for a slot was written to the child after the stop"
