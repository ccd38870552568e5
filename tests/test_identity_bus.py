"""Caller identity against real nats-servers: a mesh account for the node, two caller accounts
importing its subjects with `share: true`, a real node process and a real child that echoes the
`_meta` of every call. A caller forging another name in its arguments, its headers or `_meta` is
still recorded as itself; the child sees exactly the caller the server stamped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from runtime.bus.accounts import accounts_block
from tests.faults.security_support import ConfiguredServer, meshctl
from tests.support.callers import (
    CALLERS,
    FORGED_ARGS,
    FORGED_HEADERS,
    MESH_PASSWORD,
    MESH_USER,
    callers_node,
    callers_server,
    connect_as,
    mesh_cannot_call,
)
from tests.support.mesh import FAST_CONFIG, NatsServer, NodeProcess, make_module, wait_state


def caller(account: str, user: str | None, name: str | None, via: str) -> dict[str, Any]:
    return {"account": account, "user": user, "name": name, "via": via}


async def seen_by_child(nc: Client, subject: str, args: dict[str, Any], headers: dict[str, str] | None = None) -> dict:
    msg = await nc.request(subject, json.dumps(args).encode(), timeout=10, headers=headers)
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data
    return json.loads(msg.data)["structuredContent"]


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[ConfiguredServer, NodeProcess]]:
    server = callers_server(tmp_path / "bus")
    make_module(tmp_path / "mods", "who")
    node = None
    try:
        node = callers_node(tmp_path, server, tmp_path / "mods", "ident")
        yield server, node
    finally:
        if node:
            node.kill()
        server.stop()


async def test_each_caller_is_recorded_as_itself_whatever_it_forges(mesh: tuple[ConfiguredServer, NodeProcess]) -> None:
    server, node = mesh
    ops, alice, bob = await connect_as(server, None), await connect_as(server, "alice"), await connect_as(server, "bob")
    try:
        await wait_state(ops, node.name, "who/tools", "ready")
        seen = await seen_by_child(alice, "mesh.tool.who.meta", FORGED_ARGS, FORGED_HEADERS)
        print("\nalice sent headers", FORGED_HEADERS, "and arguments", FORGED_ARGS)
        print("the child saw _meta", seen["_meta"])
        assert seen["_meta"] == {"mesh/caller": caller("alice", "alice", "alice-client", "bus")}
        assert seen["arguments"] == FORGED_ARGS  # the arguments reach the tool as sent, and say nothing
        # Bob, forging alice the same ways, is bob.
        forged_alice = {**FORGED_HEADERS, "Nats-Request-Info": json.dumps({"acc": "alice", "user": "alice"})}
        seen = await seen_by_child(bob, "mesh.tool.who.meta", {"caller": "alice"}, forged_alice)
        assert seen["_meta"] == {"mesh/caller": caller("bob", "bob", "bob-client", "bus")}
        # A call without any forgery: the same stamp.
        seen = await seen_by_child(alice, "mesh.tool.who.meta", {})
        assert seen["_meta"] == {"mesh/caller": caller("alice", "alice", "alice-client", "bus")}
        # From inside the mesh account no call starts at all: the server refuses the publish.
        refused = await mesh_cannot_call(server, "mesh.tool.who.meta")
        assert "permissions violation" in refused.lower() and "mesh.tool.who.meta" in refused
        # A caller reaches only the mesh's tool subjects: not the node's control subjects.
        with pytest.raises(nats.errors.NoRespondersError):
            await alice.request(f"mesh.node.{node.name}.status", b"", timeout=3)
    finally:
        for nc in (ops, alice, bob):
            await nc.close()


async def test_no_client_of_the_mesh_account_can_write_a_stamp(mesh: tuple[ConfiguredServer, NodeProcess]) -> None:
    """Inside one account the server passes a client's Nats-Request-Info as written; so no user of
    the mesh account may publish a call, a cancel or a fetch (the node checks its own at start)."""
    server, node = mesh
    for subject in ("mesh.tool.who.meta", "mesh.seat.echo.say", "mesh.cancel.abcdefghijklmnop1234", "mesh.fetch.res.x"):
        refused = await mesh_cannot_call(server, subject, {"Nats-Request-Info": '{"acc":"bob","user":"bob"}'})
        assert "permissions violation" in refused.lower(), refused
    assert "caller identity: server-stamped" in node.log()
    ops = await connect_as(server, None)
    try:
        status = json.loads((await ops.request(f"mesh.node.{node.name}.status", b"", timeout=5)).data)
        assert status["identity"].startswith("server-stamped"), status["identity"]
    finally:
        await ops.close()


async def _who(nc: Client, headers: dict[str, str]) -> dict[str, Any]:
    return (await seen_by_child(nc, "mesh.tool.who.meta", {}, headers))["_meta"]["mesh/caller"]


async def test_a_bus_without_accounts_is_said_and_every_caller_there_is_local(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "bus").start()
    make_module(tmp_path / "mods", "who")
    node = NodeProcess(
        tmp_path, tmp_path / "mods", server.url, "open", config=FAST_CONFIG + '[identity]\nlocal = "ops"\n'
    )
    try:
        node.wait_log("serving on")
        nc = await nats.connect(server.url)
        try:
            forged = {**FORGED_HEADERS, "Mesh-Person": '{"iss":"https://idp.example/","sub":"bob","name":"Bob"}'}
            await wait_state(nc, node.name, "who/tools", "ready")
            assert await _who(nc, forged) == caller("ops", None, None, "local")
            status = json.loads((await nc.request(f"mesh.node.{node.name}.status", b"", timeout=5)).data)
        finally:
            await nc.close()
        warned = [line for line in node.log().splitlines() if "WARNING" in line and "caller identity" in line]
        assert len(warned) == 1 and "this bus has no accounts" in warned[0], warned
        assert status["identity"].startswith("unverified: this bus has no accounts")
        r = meshctl("node", "status", "--nats", server.url, "--name", node.name)
        assert "callers: unverified: this bus has no accounts" in r.stdout, r.stdout
    finally:
        node.kill()
        server.stop()


async def test_an_unguarded_mesh_account_makes_every_caller_local(tmp_path: Path) -> None:
    """Accounts, but the mesh account may publish calls: a client there could write any stamp, so
    the node believes none (alice's real one included) and says how to fix the bus."""
    server = ConfiguredServer(tmp_path / "bus", accounts_block([(MESH_USER, MESH_PASSWORD)], CALLERS, guard=False))
    server.start()
    make_module(tmp_path / "mods", "who")
    node = callers_node(tmp_path, server, tmp_path / "mods", "unguarded")
    try:
        alice, ops = await connect_as(server, "alice"), await connect_as(server, None)
        try:
            await wait_state(ops, node.name, "who/tools", "ready")
            assert await _who(alice, {}) == caller("ops", "node-admin", None, "local")
            forged = {"Nats-Request-Info": json.dumps({"acc": "bob", "user": "bob"})}
            assert await _who(ops, forged) == caller("ops", "node-admin", None, "local")
        finally:
            await alice.close()
            await ops.close()
        assert "mesh-node may publish mesh.tool.>" in node.log() and "deny the mesh account's users" in node.log()
    finally:
        node.kill()
        server.stop()


async def test_meshctl_call_speaks_as_the_caller_it_is_given(mesh: tuple[ConfiguredServer, NodeProcess]) -> None:
    server, node = mesh
    for user, password in (("alice", "alice-pw"), ("bob", "bob-pw")):
        r = meshctl(
            "call",
            "tool.who.meta",
            json.dumps(FORGED_ARGS),
            "--json",
            "--nats",
            server.url,
            "--user",
            user,
            "--password",
            password,
            "--timeout",
            "10",
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["structuredContent"]["_meta"]["mesh/caller"] == caller(user, user, "meshctl", "bus")


EMBEDDED_CONFIG = (
    FAST_CONFIG
    + """
[identity]
local = "ops"

[[nats.caller]]
account = "alice"
user = "alice"
password = "alice-pw"

[[nats.caller]]
account = "bob"
user = "bob"
"""
)


async def test_embedded_bus_with_two_callers_on_one_machine(tmp_path: Path) -> None:
    make_module(tmp_path / "mods", "who")
    node = NodeProcess(tmp_path, tmp_path / "mods", None, "solo", config=EMBEDDED_CONFIG)
    try:
        node.wait_log("serving on", timeout=20)
        state = ["--state-dir", str(node.state_dir)]
        bob_password_file = node.state_dir / "callers" / "bob.password"
        assert oct(bob_password_file.stat().st_mode & 0o777) == "0o600"
        assert oct((node.state_dir / "bus-mesh.password").stat().st_mode & 0o777) == "0o600"
        # The operator on this machine is in the mesh account: status and $SRV discovery work.
        status = meshctl("node", "status", *state)
        assert status.returncode == 0, status.stderr
        for _ in range(50):
            tools = meshctl("tools", *state, "--json")
            if "mesh.tool.who.meta" in tools.stdout:
                break
        assert "mesh.tool.who.meta" in tools.stdout, tools.stderr
        seen = {}
        for user, env in (
            ("alice", {"MESH_NATS_PASSWORD": "alice-pw"}),
            ("bob", {"MESH_NATS_PASSWORD": bob_password_file.read_text().strip()}),
            (None, {}),
        ):
            who = ["--user", user] if user else []
            r = meshctl("call", "tool.who.meta", '{"caller": "somebody-else"}', "--json", *state, *who, env=env)
            assert r.returncode == 0, r.stderr
            seen[user] = json.loads(r.stdout)["structuredContent"]["_meta"]["mesh/caller"]
        assert seen == {
            "alice": caller("alice", "alice", "meshctl", "bus"),
            "bob": caller("bob", "bob", "meshctl", "bus"),
            None: caller("ops", None, None, "local"),
        }
        # A wrong password is refused by the bus, named.
        r = meshctl("call", "tool.who.meta", "{}", *state, "--user", "alice", "--password", "wrong")
        assert r.returncode == 2 and "authorization" in r.stderr.lower(), r.stderr
    finally:
        node.kill()
