"""Both MCP protocol eras on the child side: the handshake (initialize, 2025-11-25) and the
stateless revision (2026-07-28: server/discover, the version envelope in every request's _meta),
each with a real raw child served by a real node; the era is chosen per child and shown in status."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime.client import MeshClient, ProgressFrame, tool_result
from runtime.meshctl.cli import main as meshctl
from tests.support.mesh import call, client, make_module, wait_state

ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"


async def test_a_child_of_each_era_is_served_side_by_side(tmp_path: Path, node_factory, capsys) -> None:
    make_module(tmp_path / "mods", "classic")
    make_module(tmp_path / "mods", "modern", env={"RAW_ERA": "stateless"})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    classic = await wait_state(nc, node.name, "classic/tools", "ready")
    modern = await wait_state(nc, node.name, "modern/tools", "ready")
    assert (classic["protocol_version"], classic["era"]) == ("2025-11-25", "handshake")
    assert (modern["protocol_version"], modern["era"]) == ("2026-07-28", "stateless")
    assert "meta" in modern["tools"] and "echo" in modern["tools"]  # tools/list carried the envelope
    for module in ("classic", "modern"):
        code, result = await call(nc, f"mesh.tool.{module}.echo", {"who": module})
        assert code == 200 and result["structuredContent"] == {"who": module}, result
    # The stateless child refuses any request without the envelope: this call went out with it.
    code, result = await call(nc, "mesh.tool.modern.meta", {})
    meta = result["structuredContent"]["_meta"]
    assert code == 200 and meta[ENVELOPE_KEY] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "mesh-node"
    code, result = await call(nc, "mesh.tool.classic.meta", {})
    assert code == 200 and ENVELOPE_KEY not in (result["structuredContent"]["_meta"] or {})
    # The node's own _meta (a progressToken here) and the envelope travel together in that era.
    for module in ("classic", "modern"):
        seen: list[ProgressFrame] = []
        raw = await MeshClient(nc).call(f"mesh.tool.{module}.progress", {"steps": 3}, on_progress=seen.append)
        assert [f.progress for f in seen] == [1, 2, 3], module
        assert tool_result(raw)["isError"] is False
    await nc.close()
    assert await asyncio.to_thread(meshctl, ["node", "status", "--nats", node.bus_url(), "--name", node.name]) == 0
    shown = capsys.readouterr().out
    rows = {line.split()[0]: line for line in shown.splitlines() if line.startswith(("classic/", "modern/"))}
    assert "2025-11-25 (handshake)" in rows["classic/tools"]
    assert "2026-07-28 (stateless)" in rows["modern/tools"]


async def test_a_stateless_child_stays_ready_across_health_checks(tmp_path: Path, node_factory) -> None:
    # The stateless revision has no ping: the node's health check asks server/discover instead,
    # so a child idle past several ping intervals is still the same, ready child.
    # (the test config pings every 0.5 s when idle and kills after 2 misses).
    make_module(tmp_path / "mods", "modern", env={"RAW_ERA": "stateless"})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    first = await wait_state(nc, node.name, "modern/tools", "ready")
    await asyncio.sleep(3)
    again = await wait_state(nc, node.name, "modern/tools", "ready")
    assert again["pid"] == first["pid"] and again["restarts"] == 0
    assert "stopped answering" not in (again["last_error"] or "")
    await nc.close()
