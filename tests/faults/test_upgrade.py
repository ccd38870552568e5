"""A delivered upgrade takes the in-place path: the new version starts, new calls wait for it, the
old one answers what it holds and goes. Calls in flight across it: none fails.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from runtime.meshctl.deliver import deliver
from tests.faults.delivery_support import write_artifact
from tests.support.mesh import call, client

pytestmark = pytest.mark.slow


async def test_calls_in_flight_across_a_delivered_upgrade_none_fails(tmp_path: Path, node_factory, nats_server) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    node = node_factory(empty)
    nc = await client(nats_server.url)
    v1 = write_artifact(tmp_path / "out" / "v1.tar.gz", "up", "1.0.0")
    v2 = write_artifact(tmp_path / "out" / "v2.tar.gz", "up", "2.0.0")
    await deliver(nc, [v1], node.name, None, progress=lambda line: None)
    deadline = time.monotonic() + 20
    while True:
        try:
            if (await call(nc, "mesh.tool.up.version", {}, timeout=2))[0] == 200:
                break
        except Exception:  # not served yet
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)

    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    upgraded_at: list[float] = []
    stop = asyncio.Event()

    async def caller(k: int) -> None:
        while not stop.is_set():
            try:
                if k % 2:  # a call that is in the child while the upgrade happens
                    code, body = await call(nc, "mesh.tool.up.sleep", {"seconds": 0.4}, timeout=15)
                else:
                    code, body = await call(nc, "mesh.tool.up.version", {}, timeout=15)
            except Exception as e:  # no responders, a timeout: a failed call
                failures.append(f"{type(e).__name__}: {e}")
                continue
            if code != 200:
                failures.append(f"{code} {body}")
                continue
            version = (body.get("structuredContent") or {}).get("version")
            outcomes[version or "slept"] += 1
            if version == "2.0.0" and not upgraded_at:
                upgraded_at.append(time.monotonic())

    callers = [asyncio.create_task(caller(k)) for k in range(8)]
    await asyncio.sleep(1.0)
    await deliver(nc, [v2], node.name, None, progress=lambda line: None)
    deadline = time.monotonic() + 30
    while not upgraded_at and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.5)  # calls on the new version for a while
    stop.set()
    await asyncio.wait_for(asyncio.gather(*callers), 30)
    print(f"\nacross the upgrade: {dict(outcomes)}; failed: {len(failures)}")
    assert upgraded_at, f"2.0.0 never answered; {dict(outcomes)} {failures[:5]}"
    assert not failures, "\n".join(failures[:5])
    assert outcomes["1.0.0"] > 0 and outcomes["2.0.0"] > 0 and outcomes["slept"] > 0, outcomes
    assert "upgrading module up 1.0.0 -> 2.0.0" in node.log()
    await nc.close()
