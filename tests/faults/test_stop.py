"""A graceful stop under load: every call in flight is answered, then the node exits 0."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import nats
import pytest

from tests.support.mesh import alive, bundle_status, call, client, make_module, marked_processes, wait_for, wait_state


@pytest.mark.slow
async def test_sigterm_with_100_calls_in_flight_answers_all_then_exits_0(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=30000)
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    child = await wait_state(nc, node.name, "alpha/tools", "ready")
    calls = [
        asyncio.create_task(call(nc, "mesh.tool.alpha.sleep", {"seconds": 1, "i": i}, timeout=30)) for i in range(100)
    ]

    async def all_in_the_child() -> bool:
        return (await bundle_status(nc, node.name, "alpha/tools"))["calls"] == 100

    await wait_for(all_in_the_child, "100 calls handed to the child", timeout=20, every=0.01)
    node.proc.send_signal(signal.SIGTERM)
    # The point is a stop with calls in flight: (nearly) all of them are, each sleeps 1 s.
    assert sum(not t.done() for t in calls) >= 90
    done, pending = await asyncio.wait(calls, timeout=30)
    assert not pending, f"{len(pending)} calls unanswered"
    results = [t.result() for t in calls]
    assert [code for code, _ in results] == [200] * 100, [b for c, b in results if c != 200][:3]
    assert all(body["structuredContent"] == {"slept": 1} for _, body in results)
    started = time.monotonic()
    assert await asyncio.to_thread(node.proc.wait, 30) == 0
    assert time.monotonic() - started < 15
    assert f"node {node.name} stopped" in node.log()
    assert "Traceback" not in node.log()
    assert not alive(child["pid"]) and marked_processes(node.name) == []
    # Once stopped, nobody serves the subject any more: the bus says so at once.
    with pytest.raises(nats.errors.NoRespondersError):
        await nc.request("mesh.tool.alpha.echo", b"{}", timeout=5)
    await nc.close()
