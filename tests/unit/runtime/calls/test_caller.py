"""The caller on the hot path, in process: every `tools/call` the dispatcher writes carries
`_meta["mesh/caller"]` from the server's stamp or the node's local identity, on the fast path
and on a call that waits for its bundle's start; an unreadable stamp never reaches the child."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runtime.calls.identity import CallerStamp
from runtime.wire.identity import REQUEST_INFO, local_caller
from tests.support.fake_child import Script
from tests.unit.runtime.calls.test_dispatch import Mesh, end, new_mesh

LOCAL = {"account": "ops", "user": "admin", "name": None, "via": "local"}
ALICE = {"account": "alice", "user": "alice", "name": "alice-cli", "via": "bus"}
ALICE_STAMP = json.dumps({"acc": "alice", "user": "alice", "name": "alice-cli", "rtt": 1000, "kind": "Client"})
SUBJECT = "mesh.tool.m.greet"


def calls(script: Script) -> list[dict[str, Any]]:
    """The params of every tools/call the children were written."""
    return [m["params"] for c in script.started for m in c.received if m.get("method") == "tools/call"]


@pytest.fixture
async def mesh(script: Script):
    mesh = new_mesh(timeout_ms=1000, stamp=CallerStamp(local_caller("ops/admin")))
    yield mesh
    await end(mesh)


async def test_local_and_stamped_callers_reach_the_child_and_the_arguments_stay_as_sent(
    mesh: Mesh, script: Script
) -> None:
    await mesh.ready()
    forged = b'{"_meta":{"mesh/caller":{"account":"bob"}},"who":"bob"}'
    assert (await mesh.ask(SUBJECT, forged))[1] is None
    assert (await mesh.ask(SUBJECT, forged, {REQUEST_INFO: ALICE_STAMP, "X-Caller": "bob"}))[1] is None
    first, second = calls(script)
    assert first["_meta"] == {"mesh/caller": LOCAL} and second["_meta"] == {"mesh/caller": ALICE}
    assert first["arguments"] == second["arguments"] == {"_meta": {"mesh/caller": {"account": "bob"}}, "who": "bob"}


async def test_a_call_waiting_for_the_start_carries_its_caller_too(mesh: Mesh, script: Script) -> None:
    asking = asyncio.ensure_future(mesh.ask(SUBJECT, b"{}", {REQUEST_INFO: ALICE_STAMP}))
    await asyncio.sleep(0.05)  # the route is not known yet: the call waits for the start
    mesh.start()
    assert (await asking)[1] is None
    assert [c["_meta"] for c in calls(script)] == [{"mesh/caller": ALICE}]


async def test_an_unreadable_stamp_is_400_and_never_reaches_the_child(mesh: Mesh, script: Script) -> None:
    await mesh.ready()
    body, code = await mesh.ask(SUBJECT, b"{}", {REQUEST_INFO: '{"user":"x"}'})
    assert code == "400" and "names no account" in body["error"]["message"]
    assert calls(script) == []
