"""Calls through the MCP face carry the face's own NATS identity, marked via "mcp" by the node,
against a real nats-server with accounts: the face is user `face` of account `faces`, listed in
the node's `[identity] mcp_faces`. Nothing an MCP client sends (arguments, the request's
`_meta`) changes it, and a caller not listed is via "bus" even when it runs `meshctl mcp` itself."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, AsyncIterator

import nats
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from runtime.wire.identity import os_user
from tests.faults.security_support import ConfiguredServer, accounts_mesh
from tests.support.mesh import MESHCTL, ROOT, NodeProcess, wait_state

CALLERS = [("alice", "alice", "alice-pw"), ("faces", "face", "face-pw")]
FORGED = {"_meta": {"mesh/caller": {"account": "alice", "user": "alice", "via": "bus"}}, "caller": "alice"}


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[ConfiguredServer, NodeProcess]]:
    server, node = accounts_mesh(tmp_path, CALLERS, 'local = "ops/admin"\nmcp_faces = ["faces/face"]\n', "faceid")
    try:
        ops = await nats.connect(server.url, user="mesh-node", password="mesh-pw")
        await wait_state(ops, node.name, "who/tools", "ready")
        await ops.close()
        yield server, node
    finally:
        node.kill()
        server.stop()


def _face(url: str, user: str, password: str, *more: str) -> StdioServerParameters:
    args = [*MESHCTL[1:], "mcp", "--nats", url, "--user", user, "--password", password, "--only", "who_meta", *more]
    return StdioServerParameters(command=MESHCTL[0], args=args, cwd=str(ROOT))


async def _seen(c: Client) -> dict[str, Any]:
    forged_meta: Any = {"mesh/caller": {"account": "alice", "via": "bus"}}  # an MCP request's own _meta
    result = await c.call_tool("who_meta", FORGED, meta=forged_meta)
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict)
    meta = result.structured_content["_meta"]
    assert isinstance(meta["progressToken"], int)  # the node's token (the face always asks for progress)
    return meta["mesh/caller"]


async def test_calls_through_the_face_are_the_faces_and_via_mcp(mesh: tuple[ConfiguredServer, NodeProcess]) -> None:
    server, _ = mesh
    async with Client(_face(server.url, "face", "face-pw"), mode="legacy", cache=None) as c:
        names = [t.name for t in (await c.list_tools()).tools]
        assert names == ["who_meta"]  # the face in its own account sees the nodes' tools ($SRV.INFO import)
        seen = await _seen(c)
    print("\nthe child saw, through the face:", json.dumps(seen))
    assert seen == {"account": "faces", "user": "face", "name": "meshctl-mcp", "via": "mcp"}
    # alice running a face of her own is alice, via "bus": only configured faces are "mcp".
    async with Client(_face(server.url, "alice", "alice-pw"), mode="legacy", cache=None) as c:
        seen = await _seen(c)
    assert seen == {"account": "alice", "user": "alice", "name": "meshctl-mcp", "via": "bus"}
    # And alice straight on the bus, with the face's name as her connection name, is still alice.
    alice = await nats.connect(server.url, user="alice", password="alice-pw", name="meshctl-mcp")
    try:
        msg = await alice.request("mesh.tool.who.meta", b"{}", timeout=10)
        assert json.loads(msg.data)["structuredContent"]["_meta"]["mesh/caller"]["via"] == "bus"
    finally:
        await alice.close()


def test_mcp_faces_are_checked_at_start(tmp_path: Path) -> None:
    from runtime.config import ConfigError, load_config

    path = tmp_path / "node.toml"
    path.write_text('[identity]\nmcp_faces = ["faces/"]\n')
    with pytest.raises(ConfigError, match="identity.mcp_faces"):
        load_config(str(path))


async def test_a_face_started_as_a_delegate_passes_the_os_user_and_only_a_listed_one_may(
    mesh: tuple[ConfiguredServer, NodeProcess],
) -> None:
    server, _ = mesh
    me = {"iss": f"unix:{socket.gethostname()}", "sub": os_user(), "name": os_user()}
    async with Client(_face(server.url, "face", "face-pw", "--delegate"), mode="legacy", cache=None) as c:
        seen = await _seen(c)
    assert seen == {"account": "faces", "user": "face", "name": "meshctl-mcp", "via": "mcp", "person": me}
    # alice claiming to be a delegate: the node refuses the person, and the client is told why.
    async with Client(_face(server.url, "alice", "alice-pw", "--delegate"), mode="legacy", cache=None) as c:
        result = await c.call_tool("who_meta", {})
    assert result.is_error
    text = " ".join(getattr(part, "text", "") for part in result.content)
    assert "400" in text and "caller alice/alice is not a delegate" in text, text
