"""Two NATS clusters on 127.0.0.1 joined by a gateway: each region's calls stay in it while it
serves them, and go over the gateway when its node stops; JetStream (the catalogue) is one for both.

Node `east-a` is on cluster east, `west-b` on cluster west; both serve module `dual` (the raw
test child, whose `whoami` says which node answered) in the one queue group. A caller on east is
answered by east-a only, one on west by west-b only (NATS prefers its own cluster's queue
members). While callers on east keep calling, east-a stops (SIGTERM): every call is answered,
by east-a until it drained and by west-b after; none fails. Started again, east-a takes east's
calls back; killed (SIGKILL), only the calls in flight on it fail (their timeout), the next ones
go to west-b. The catalogue, read on east, names each node's cluster, as `node status` does, and
drops east-a when it stops.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import AsyncIterator, Callable

import nats
import pytest
from nats.aio.client import Client

from runtime.bus.catalog_watch import CatalogWatcher
from tests.support.mesh import NodeProcess, make_module, status, wait_for, wait_state
from tests.support.regions import Supercluster

pytestmark = pytest.mark.slow

CALLERS = 8  # calls in flight from east at any time
FAST = """
drain_timeout_s = 10
[restart]
backoff_initial_s = 0.1
[health]
ping_interval_s = 5
"""


class Regions:
    def __init__(self, root: Path, sc: Supercluster, nodes: list[NodeProcess]) -> None:
        self.root, self.sc, self.nodes = root, sc, nodes

    def start_east(self) -> NodeProcess:
        node = NodeProcess(self.root, self.root / "mods", self.sc.url("east"), "east-a", config=FAST)
        self.nodes.append(node)
        return node


@pytest.fixture
async def regions(tmp_path: Path) -> AsyncIterator[Regions]:
    sc = Supercluster(tmp_path / "bus").start()
    nodes: list[NodeProcess] = []
    try:
        await sc.wait_jetstream()
        make_module(tmp_path / "mods", "dual")
        regions = Regions(tmp_path, sc, nodes)
        regions.start_east()
        nodes.append(NodeProcess(tmp_path, tmp_path / "mods", sc.url("west"), "west-b", config=FAST))
        ops = await nats.connect(sc.url("east"))
        try:
            for node in nodes:
                await wait_state(ops, node.name, "dual/tools", "ready", timeout=60)
        finally:
            await ops.close()
        yield regions
    finally:
        for node in nodes:
            node.kill()
        sc.stop()


async def whoami(nc: Client, timeout: float = 10) -> str:
    msg = await nc.request("mesh.tool.dual.whoami", b"{}", timeout=timeout)
    node: str = json.loads(msg.data)["structuredContent"]["node"]
    return node


class Calls:
    def __init__(self) -> None:
        self.answered: list[tuple[float, str]] = []
        self.failed: list[tuple[float, str]] = []
        self.stopped_at = self.exited_at = 0.0

    @property
    def before(self) -> Counter[str]:
        return Counter(n for t, n in self.answered if t < self.stopped_at)

    @property
    def after(self) -> Counter[str]:
        return Counter(n for t, n in self.answered if t > self.exited_at + 0.5)

    def first(self, node: str) -> float | None:
        """When `node` first answered, after the calls began."""
        return next((t for t, n in self.answered if n == node), None)


async def calling(nc: Client, stop: Callable[[], None], node: NodeProcess, timeout: float = 10) -> Calls:
    """CALLERS loops calling whoami on `nc`; after 1 s `stop()` ends `node`; the calls' timeout and 1.5 s
    after it exited, the end."""
    calls = Calls()
    done = asyncio.Event()

    async def caller() -> None:
        while not done.is_set():
            started = time.monotonic()
            try:
                node = await whoami(nc, timeout)
                calls.answered.append((time.monotonic(), node))  # when it was answered
            except Exception as e:  # counted: the test says how many and when they began
                calls.failed.append((started, f"{type(e).__name__}: {e}"))
            await asyncio.sleep(0.005)  # a steady stream, not a flood: the machine is shared

    loops = [asyncio.get_running_loop().create_task(caller()) for _ in range(CALLERS)]
    await asyncio.sleep(1.0)
    calls.stopped_at = time.monotonic()
    stop()
    await asyncio.to_thread(node.proc.wait, 30)
    calls.exited_at = time.monotonic()
    await asyncio.sleep(timeout + 1.5)
    done.set()
    await asyncio.gather(*loops)
    during = Counter(n for t, n in calls.answered if calls.stopped_at <= t <= calls.exited_at + 0.5)
    print(
        f"\n{node.name} stopped: before {dict(calls.before)}; during ({calls.exited_at - calls.stopped_at:.2f} s, "
        f"+0.5 s) {dict(during)}; after {dict(calls.after)}; failed {len(calls.failed)} {calls.failed[:2]}; "
        f"first answer of west-b {(calls.first('west-b') or 0) - calls.stopped_at:+.3f} s from the stop"
    )
    return calls


async def test_calls_stay_in_their_region_and_cross_when_its_node_stops(regions: Regions) -> None:
    east = await nats.connect(regions.sc.url("east"))
    west = await nats.connect(regions.sc.url("west"))
    watcher = CatalogWatcher(east)
    task = asyncio.get_running_loop().create_task(watcher.run())
    try:
        assert Counter([await whoami(east) for _ in range(40)]) == {"east-a": 40}
        assert Counter([await whoami(west) for _ in range(40)]) == {"west-b": 40}
        # Each node's cluster, said by its status and by the catalogue (read on east, the bucket's
        # JetStream one domain over the gateway).
        assert (await status(east, "east-a"))["cluster"] == "east"
        assert (await status(east, "west-b"))["cluster"] == "west"
        await wait_for(lambda: watcher.ready and len(watcher.tools_of("mesh.tool.dual.whoami")) == 2, "both nodes")
        assert {(t.node, t.cluster) for t in watcher.tools_of("mesh.tool.dual.whoami")} == {
            ("east-a", "east"),
            ("west-b", "west"),
        }

        # A clean stop (SIGTERM) while east keeps calling: none fails.
        calls = await calling(east, lambda: regions.nodes[0].proc.terminate(), regions.nodes[0])
        assert set(calls.before) == {"east-a"} and calls.before["east-a"] > 100
        assert set(calls.after) == {"west-b"} and calls.after["west-b"] > 100
        assert calls.failed == []  # the calls in flight at the stop were answered by east-a's drain
        await wait_for(
            lambda: [t.node for t in watcher.tools_of("mesh.tool.dual.whoami")] == ["west-b"], "east-a out", timeout=5
        )
        # Back: east's calls stay in east again.
        again = regions.start_east()
        await wait_state(east, "east-a", "dual/tools", "ready", timeout=60)
        assert Counter([await whoami(east) for _ in range(40)]) == {"east-a": 40}
        # A crash (SIGKILL): only the calls in flight on east-a at that moment fail (their timeout).
        calls = await calling(east, again.proc.kill, again, timeout=2)
        assert set(calls.after) == {"west-b"} and calls.after["west-b"] > 100
        assert len(calls.failed) <= CALLERS and all(t <= calls.stopped_at + 2.5 for t, _ in calls.failed), calls.failed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await east.close()
        await west.close()
