"""The memory under the issue's flood and paging while others write, through a real node on a real
nats-server with two caller accounts (issue 25's "done when").

- The flood: a data file that already holds 2,900 entries of "a" + "\\x1c" * 3998 + "b" (as release
  0.1.0 let them in), the same 2,900 sent again over the bus (each refused now), and 2,900 of its
  twin made of tabs (a caller may send tabs) written over the bus; then load_context at the default
  budget and at 200,000, recall's widest page, history. Every reply stays under MAX_REPLY_BYTES (so
  under the bus's max_payload, far under the node's 64 MiB line limit), the child is never restarted,
  and the other member is answered throughout.
- Paging: 2,000 entries, paged through with a cursor while another member writes 200 more on its
  own connection: none repeated, none skipped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from tests.support.memory_store import version_2_store  # first: the module's source on sys.path

# isort: split
from memory.model import MAX_REPLY_BYTES
from memory.store import DB_FILE

from tests.faults.security_support import ConfiguredServer
from tests.support.callers import callers_node, callers_server, connect_as
from tests.support.mesh import ROOT, NodeProcess, wait_state

pytestmark = pytest.mark.slow
FLOOD = "a" + "\x1c" * 3998 + "b"
TABS = "a" + "\t" * 3998 + "b"
NODE = "memory-flood"


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[tuple[ConfiguredServer, NodeProcess]]:
    mods = tmp_path / "mods"
    shutil.copytree(ROOT / "bundles" / "memory", mods / "memory", ignore=shutil.ignore_patterns("__pycache__"))
    # The node's data folder for the module (<state>/data/memory), holding the flood as 0.1.0 wrote it.
    version_2_store(tmp_path / f"state-{NODE}" / "data" / "memory" / DB_FILE, [("status", FLOOD)] * 2900)
    server = callers_server(tmp_path / "bus")
    node = None
    try:
        node = callers_node(tmp_path, server, mods, NODE, init_timeout_s=20)
        yield server, node
    finally:
        if node:
            node.kill()
        server.stop()


async def ask(nc: Client, verb: str, **args: Any) -> tuple[int, dict[str, Any]]:
    """(bytes of the reply, the CallToolResult); a runtime error fails the test."""
    msg = await nc.request(f"mesh.seat.memory.{verb}", json.dumps(args).encode(), timeout=60)
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), (msg.headers, msg.data[:500])
    return len(msg.data), json.loads(msg.data)


async def answered(nc: Client, verb: str, **args: Any) -> dict[str, Any]:
    size, body = await ask(nc, verb, **args)
    assert size <= MAX_REPLY_BYTES, (verb, size)
    assert body["isError"] is False, body["content"][0]["text"][:500]
    return body["structuredContent"]


async def in_batches(calls: list[Any], width: int = 50) -> list[Any]:
    done: list[Any] = []
    for start in range(0, len(calls), width):
        done += await asyncio.gather(*calls[start : start + width])
    return done


def test_the_flood_leaves_the_child_up_and_every_reply_bounded(mesh: tuple[ConfiguredServer, NodeProcess]) -> None:
    server, node = mesh

    async def run() -> None:
        alice, bob, ops = [await connect_as(server, who) for who in ("alice", "bob", None)]
        try:
            before = await wait_state(ops, node.name, "memory/tools", "ready", timeout=90)
            assert "schema 2 -> 3" in node.log()  # the step migrated the flooded file before the tools began
            marker = await answered(bob, "remember", content="Bob's marker.", type="decision", key="bob.marker")

            async def bob_is_answered() -> None:
                assert [e["id"] for e in (await answered(bob, "recall", key="bob.marker"))["entries"]] == [marker["id"]]

            # The flood, again over the bus: refused, each with the reason; bob answered between.
            refusals = await in_batches([ask(alice, "remember", content=FLOOD, type="status") for _ in range(2900)])
            assert all(body["isError"] for _, body in refusals)
            assert "control character (U+001C at character 2)" in refusals[0][1]["content"][0]["text"]
            await bob_is_answered()
            # Its twin of tabs, which a caller may send: written.
            written = await in_batches([ask(alice, "remember", content=TABS, type="status") for _ in range(2900)])
            assert not any(body["isError"] for _, body in written)
            await bob_is_answered()

            default = await answered(alice, "load_context")
            assert len(default["text"]) <= 8000 and default["truncated"] is True
            assert sum(default["left_out"].values()) + len(default["entries"]) == 5801
            widest = await answered(alice, "load_context", budget_chars=200_000)
            assert len(widest["text"]) <= 200_000 and widest["truncated"] is True
            page = await answered(bob, "recall", limit=200)
            assert 0 < len(page["entries"]) < 200 and page["next_cursor"]
            old = await answered(bob, "history", id=1)
            assert old["versions"][0]["content"] == FLOOD and old["versions"][0]["action"] == "import"
            await bob_is_answered()

            after = await wait_state(ops, node.name, "memory/tools", "ready")
            assert (after["pid"], after["restarts"]) == (before["pid"], before["restarts"])  # never killed
        finally:
            for nc in (alice, bob, ops):
                await nc.close()

    asyncio.run(run())


def test_paging_2000_entries_while_another_member_writes_200(mesh: tuple[ConfiguredServer, NodeProcess]) -> None:
    server, node = mesh

    async def run() -> None:
        alice, bob, ops = [await connect_as(server, who) for who in ("alice", "bob", None)]
        try:
            await wait_state(ops, node.name, "memory/tools", "ready", timeout=90)
            await in_batches(
                [
                    answered(alice, "remember", content=f"Wombat rule {i} of the ledger.", type="decision")
                    for i in range(2000)
                ]
            )
            for round, filters in enumerate(({"type": "decision"}, {"query": "wombat rule"})):
                expected = await page_all(alice, filters, limit=200)
                assert len(expected) == 2000 + 200 * round  # with bob's of the round before
                writes = Writes(bob)
                async with asyncio.TaskGroup() as group:
                    group.create_task(writes.run())  # bob, on his own connection, while alice pages
                    seen = await page_all(alice, filters, limit=50, between=writes.until)
                assert writes.done == 200
                assert len(seen) == len(set(seen)), "an entry was repeated"
                assert set(expected) <= set(seen), "an entry was skipped"
                # What else is listed was written by bob before the first page (the listing begins there).
                assert set(seen) - set(expected) <= set(writes.ids)
        finally:
            for nc in (alice, bob, ops):
                await nc.close()

    asyncio.run(run())


class Writes:
    """200 remembers by one member, and a wait for as many as a page needs (five a page)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.done = 0
        self.ids: list[int] = []
        self.progress = asyncio.Event()

    async def run(self) -> None:
        for i in range(200):
            made = await answered(self.nc, "remember", content=f"Wombat rule {i} added by bob.", type="decision")
            self.ids.append(made["id"])
            self.done += 1
            self.progress.set()

    async def until(self, pages: int) -> None:
        while self.done < min(200, 5 * pages):
            self.progress.clear()
            await self.progress.wait()


async def page_all(nc: Client, filters: dict[str, Any], limit: int, between: Any = None) -> list[int]:
    seen: list[int] = []
    page = await answered(nc, "recall", limit=limit, **filters)
    pages = 1
    while True:
        seen += [e["id"] for e in page["entries"]]
        if between is not None:
            await between(pages)
        if page["next_cursor"] is None:
            return seen
        page = await answered(nc, "recall", limit=limit, cursor=page["next_cursor"], **filters)
        pages += 1
