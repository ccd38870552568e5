"""A node's control subjects, typed (runtime/wire/control.py): status, restart, seat-move.

Ported from tests/test_node.py and tests/faults/test_children.py (meshctl node status/restart)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import nats

from runtime.wire.control import RestartReply, SeatMoveReply
from runtime.wire.subjects import RESTART, SEAT_MOVE, node_subject
from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder, until


async def restart(m: Mesh, node: str, body: bytes) -> RestartReply:
    reply = await m.nc.request(node_subject(node, RESTART), body, timeout=5)
    return msgspec.json.decode(reply.data, type=RestartReply)


async def test_status_is_typed_and_names_modules_bundles_and_the_bus(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, tools=("greet", "wave"))]
    folder = module_folder(tmp_path, "alpha", version="1.2.3")
    await m.start("n1", folder)
    status = await m.bundle_state("n1", "alpha/tools", "ready")
    assert status.node == "n1" and status.url == m.nats.url and status.uptime_s >= 0
    assert [(s.name, s.version, s.source) for s in status.modules] == [("alpha", "1.2.3", str(folder))]
    bundle = status.bundle("alpha/tools")
    assert bundle is not None and bundle.pid == script.of("alpha")[0].pid
    assert (bundle.kind, bundle.runs, bundle.language, bundle.tools) == ("tools", "node", "python", ["greet", "wave"])
    assert (bundle.protocol_version, bundle.era, bundle.restarts) == ("2025-11-25", "handshake", 0)
    assert status.seats == [] and status.problems == [] and status.bundle("alpha/nope") is None


async def test_status_counts_the_calls_in_flight_and_answered(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, call_seconds=30)]
    await m.start("n1", module_folder(tmp_path, "alpha", timeout_ms=10000))
    pending = [asyncio.create_task(m.call("mesh.tool.alpha.greet", {}, timeout=10)) for _ in range(3)]
    child = script.of("alpha")[0]
    await until(lambda: len(child.calls()) == 3, "three calls in the child")
    status = await m.status("n1")
    assert (status.in_flight, status.answered) == (3, 0)
    assert status.bundle("alpha/tools").in_flight == 3  # type: ignore[union-attr]
    child.kill()
    await asyncio.gather(*pending)
    status = await m.status("n1")
    assert (status.in_flight, status.answered) == (0, 3)


async def test_a_failed_bundle_restarted_by_an_operator_serves_again(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["broken"] = [Behaviour(unstartable=True)]
    await m.start("n1", module_folder(tmp_path, "broken"))
    await m.bundle_state("n1", "broken/tools", "failed")
    script.modules["broken"] = [Behaviour(answer=echo)]  # fixed
    reply = await restart(m, "n1", b'{"bundle": "broken/tools"}')
    assert reply == RestartReply(ok=True, bundle="broken/tools", was="failed")
    await m.bundle_state("n1", "broken/tools", "ready")
    result, code = await m.call("mesh.tool.broken.greet", {"back": True})
    assert code is None and result["content"][0]["text"] == 'greet: {"back": true}'


async def test_a_ready_bundle_restarted_gets_a_new_child_and_a_call_rides_over_it(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    first = (await m.bundle_state("n1", "alpha/tools", "ready")).bundle("alpha/tools")
    reply = await restart(m, "n1", b'{"bundle": "alpha"}')  # a module of one bundle names it
    assert reply == RestartReply(ok=True, bundle="alpha/tools", was="ready")
    result, code = await m.call("mesh.tool.alpha.greet", {"during": "restart"})
    assert code is None and "during" in result["content"][0]["text"]
    again = (await m.bundle_state("n1", "alpha/tools", "ready")).bundle("alpha/tools")
    assert again is not None and first is not None
    assert again.pid != first.pid and again.restarts == 1 and not script.of("alpha")[0].running


async def test_a_bundle_name_two_modules_share_is_ambiguous_and_an_unknown_one_is_named(
    tmp_path: Path, m: Mesh
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"), module_folder(tmp_path, "beta"))
    reply = await restart(m, "n1", b'{"bundle": "tools"}')
    assert not reply.ok and reply.error == "bundle 'tools' is ambiguous; bundles here: alpha/tools, beta/tools"
    reply = await restart(m, "n1", b'{"bundle": "gamma/tools"}')
    assert (
        not reply.ok
        and "bundle 'gamma/tools' is not on this node; bundles here: alpha/tools, beta/tools" == reply.error
    )
    for junk in (b"{not json", b'{"bundle": 5}', b""):
        reply = await restart(m, "n1", junk)
        assert not reply.ok and reply.error.startswith("bundle '' is not on this node"), (junk, reply)
    assert (await m.status("n1")).bundle("alpha/tools").restarts == 0  # type: ignore[union-attr]


async def test_seat_move_of_a_seat_the_node_does_not_hold_says_which_it_has(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    for body in (b'{"seat": "memory", "to": "n2"}', b"junk"):
        msg = await m.nc.request(node_subject("n1", SEAT_MOVE), body, timeout=5)
        reply = msgspec.json.decode(msg.data, type=SeatMoveReply)
        assert not reply.ok and "has no stateful seat" in reply.error and "seats with a lease here: none" in reply.error


async def test_a_stopped_node_answers_no_control_subject(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.stop("n1")
    for verb in ("status", RESTART, SEAT_MOVE):
        try:
            await m.nc.request(node_subject("n1", verb), b"{}", timeout=5)
        except nats.errors.NoRespondersError:
            continue
        raise AssertionError(f"{verb} answered by a stopped node")
