"""Test support for calls by caller accounts: a nats-server with the mesh account (the nodes')
and two caller accounts importing its services with `share: true` (runtime/bus/accounts.py writes
the block), a node on it, and a connection per caller. The server stamps every request from a
caller account with `Nats-Request-Info`; the node passes exactly that to the child. The mesh
account's users may not publish a call at all (so none can write a stamp of its own):
`mesh_cannot_call` shows the server refusing one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
from nats.aio.client import Client

from runtime.bus.accounts import accounts_block
from tests.faults.security_support import ConfiguredServer, node_config
from tests.support.mesh import NodeProcess

MESH_USER, MESH_PASSWORD = "mesh-node", "mesh-pw"
CALLERS = [("alice", "alice", "alice-pw"), ("bob", "bob", "bob-pw")]
PASSWORDS = {user: password for _, user, password in CALLERS}
LOCAL = "ops/node-admin"

# Everything a caller can write to pass for bob: the header the server owns, headers of its own,
# an `_meta` and names in the arguments.
FORGED_HEADERS = {
    "Nats-Request-Info": json.dumps({"acc": "bob", "user": "bob", "name": "bob-client"}),
    "X-Caller": "bob",
    "X-Mesh-Account": "bob",
}
FORGED_ARGS = {
    "_meta": {"mesh/caller": {"account": "bob", "user": "bob", "via": "bus"}},
    "caller": "bob",
    "account": "bob",
    "author": "bob/bob",
}


def callers_server(workdir: Path) -> ConfiguredServer:
    """Started; the test that asked for it stops it."""
    return ConfiguredServer(workdir, accounts_block([(MESH_USER, MESH_PASSWORD)], CALLERS)).start()


def callers_node(
    workdir: Path, server: ConfiguredServer, manifests: Path, name: str, *, init_timeout_s: int = 2
) -> NodeProcess:
    """A node in the mesh account whose own calls carry the local identity LOCAL; started and
    serving. `init_timeout_s`: a Python SDK child imports `mcp`, which takes a while on a busy machine."""
    config = node_config({"url": server.url, "user": MESH_USER, "password": MESH_PASSWORD})
    config = config.replace("init_timeout_s = 2", f"init_timeout_s = {init_timeout_s}")
    node = NodeProcess(workdir, manifests, None, name, config=config + f'\n[identity]\nlocal = "{LOCAL}"\n')
    node.wait_log("serving on", timeout=30)
    return node


async def connect_as(server: ConfiguredServer, user: str | None) -> Client:
    """A caller's own connection (its client name `<user>-client`), or the mesh account's for None."""
    if user is None:
        return await nats.connect(server.url, user=MESH_USER, password=MESH_PASSWORD, name="ops-client")
    return await nats.connect(server.url, user=user, password=PASSWORDS[user], name=f"{user}-client")


async def mesh_cannot_call(server: ConfiguredServer, subject: str, headers: dict[str, str] | None = None) -> str:
    """Publish a call from the mesh account; the server's refusal, as the client was told it."""
    refused: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(e: Exception) -> None:
        refused.put_nowait(str(e))

    nc = await nats.connect(server.url, user=MESH_USER, password=MESH_PASSWORD, error_cb=on_error)
    try:
        await nc.publish(subject, b"{}", reply=nc.new_inbox(), headers=headers)
        await nc.flush()
        return await asyncio.wait_for(refused.get(), 5)
    finally:
        await nc.close()
