"""A caller account reads the catalogue and follows it, and writes nothing to it: the exports of
runtime/bus/accounts.py (the catalogue stream's direct gets, its republished writes) on a real
nats-server with accounts, and a real node process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import AsyncIterator

import nats
import pytest
from nats.js.errors import NoStreamResponseError

from runtime.bus.catalog_watch import CatalogWatcher, read_catalog
from runtime.wire.catalog import BeatRecord, encode, stored_subject
from runtime.wire.control import RestartAsk
from runtime.wire.subjects import RESTART, node_subject
from tests.faults.security_support import ConfiguredServer, accounts_mesh
from tests.support.mesh import NodeProcess, wait_for, wait_state


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[ConfiguredServer, NodeProcess]]:
    server, node = accounts_mesh(tmp_path, [("alice", "alice", "alice-pw")], 'local = "ops/admin"\n', "catacc")
    try:
        ops = await nats.connect(server.url, user="mesh-node", password="mesh-pw")
        await wait_state(ops, node.name, "who/tools", "ready")
        await ops.close()
        yield server, node
    finally:
        node.kill()
        server.stop()


async def test_a_caller_account_reads_and_follows_the_catalogue_and_cannot_write_it(
    mesh: tuple[ConfiguredServer, NodeProcess],
) -> None:
    server, node = mesh
    alice = await nats.connect(server.url, user="alice", password="alice-pw")
    ops = await nats.connect(server.url, user="mesh-node", password="mesh-pw")
    try:

        async def ready_tools() -> set[str]:
            found = await read_catalog(alice)
            return {t.subject for t in found.tools() if t.node == node.name and t.state == "ready"}

        subjects = await wait_for(ready_tools, "the node's tools in alice's read", ok=lambda s: len(s) > 5)
        assert "mesh.tool.who.meta" in subjects
        # Followed: a restart reaches alice's watcher as republished writes.
        watcher = CatalogWatcher(alice)
        task = asyncio.get_running_loop().create_task(watcher.run())
        try:
            await wait_for(lambda: watcher.ready and watcher.tools_of("mesh.tool.who.meta"), "alice's watcher")
            await ops.request(node_subject(node.name, RESTART), encode(RestartAsk("who/tools")), timeout=5)
            await wait_for(
                lambda: [b.restarts for n in watcher.nodes() for b in n.bundles] == [1], "the restart seen", timeout=20
            )
            assert watcher.stats.messages > 0 and watcher.stats.resyncs == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # Writing is the mesh account's alone: alice's publish to the stream's subject reaches no stream.
        js = alice.jetstream()
        with pytest.raises((NoStreamResponseError, nats.errors.TimeoutError)):
            await js.publish(stored_subject("intruder.beat"), encode(BeatRecord("x")), timeout=1)
        # Nor can it make a consumer on it: its own account has no JetStream, the mesh's API is not imported.
        answer = json.loads((await alice.request("$JS.API.CONSUMER.CREATE.KV_mesh-catalog", b"{}", timeout=2)).data)
        assert "not enabled" in answer["error"]["description"], answer
        assert not [t for t in (await read_catalog(alice)).tools() if t.node == "intruder"]
    finally:
        await alice.close()
        await ops.close()
