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

from tests.faults.security_support import ConfiguredServer, meshctl
from tests.support.callers import FORGED_ARGS, FORGED_HEADERS, callers_node, callers_server, connect_as
from tests.support.mesh import FAST_CONFIG, NodeProcess, make_module, wait_state


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
        # From inside the mesh account, with no header: the node's local identity.
        seen = await seen_by_child(ops, "mesh.tool.who.meta", {"caller": "bob"})
        assert seen["_meta"] == {"mesh/caller": caller("ops", "node-admin", None, "local")}
        # A caller reaches only the mesh's tool subjects: not the node's control subjects.
        with pytest.raises(nats.errors.NoRespondersError):
            await alice.request(f"mesh.node.{node.name}.status", b"", timeout=3)
    finally:
        for nc in (ops, alice, bob):
            await nc.close()


async def test_a_mesh_account_client_is_infrastructure_its_header_is_believed(
    mesh: tuple[ConfiguredServer, NodeProcess],
) -> None:
    """Documented, not a hole: inside the mesh account no import stamps, so users there are trusted."""
    server, node = mesh
    ops = await connect_as(server, None)
    try:
        await wait_state(ops, node.name, "who/tools", "ready")
        seen = await seen_by_child(ops, "mesh.tool.who.meta", {}, {"Nats-Request-Info": '{"acc":"bob","user":"bob"}'})
        assert seen["_meta"] == {"mesh/caller": caller("bob", "bob", None, "bus")}
        # An unreadable stamp from infrastructure is a bad request, not a guess.
        msg = await ops.request("mesh.tool.who.meta", b"{}", headers={"Nats-Request-Info": "not json"}, timeout=5)
        headers = msg.headers or {}
        assert headers.get("Nats-Service-Error-Code") == "400"
        assert "Nats-Request-Info header is not the server's client info" in headers.get("Nats-Service-Error", "")
    finally:
        await ops.close()


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
