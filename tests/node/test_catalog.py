"""The catalogue with real nodes in this process: what they write to `mesh-catalog`, what a watcher sees."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
import msgspec
import pytest
from nats.aio.client import Client

from runtime.bus.catalog import Entry, scan
from runtime.bus.catalog_view import CatalogChange
from runtime.bus.catalog_watch import CatalogWatcher, read_catalog
from runtime.wire.catalog import (
    MAX_TOOLS_PER_NODE,
    BeatRecord,
    DefsPart,
    NodeRecord,
    StateRecord,
    ToolDef,
    beat_key,
    defs_key,
    encode,
    node_key,
    state_key,
    stored_subject,
)
from runtime.wire.control import RestartAsk
from runtime.wire.subjects import RESTART, node_subject
from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder


class Watching:
    """A watcher run by the test, with every change it reported.

    Its task is the test's own (pytest-asyncio sets a fixture up and tears it down in different
    tasks, so no task group can span the test); `stop` cancels it and waits for it."""

    def __init__(self, nc: Client) -> None:
        self.changes: list[tuple[float, CatalogChange]] = []
        self.watcher = CatalogWatcher(
            nc, on_change=lambda c: self.changes.append((time.monotonic(), c)), resync_min_s=0.1
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Watching:
        self._task = asyncio.get_running_loop().create_task(self.watcher.run())
        with anyio.fail_after(5):
            while not self.watcher.ready:
                if self._task.done():
                    self._task.result()
                await anyio.sleep(0.005)
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def until(self, what: str, ok: Callable[[CatalogWatcher], bool], timeout: float = 5) -> None:
        try:
            with anyio.fail_after(timeout):
                while not ok(self.watcher):
                    await anyio.sleep(0.01)
        except TimeoutError:
            raise AssertionError(f"{what}: not within {timeout} s; tools {tools_of(self.watcher)}") from None


@pytest.fixture
async def w(m: Mesh) -> AsyncIterator[Watching]:
    watching = await Watching(m.nc).start()
    yield watching
    await watching.stop()


def tools_of(watcher: CatalogWatcher) -> set[tuple[str, str, str]]:
    return {(t.subject, t.node, t.state) for t in watcher.tools()}


async def stored(nc: Client, prefix: str = ">") -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}

    def keep(got: Entry | str) -> None:
        if isinstance(got, Entry):
            found[got.key] = got.value

    await scan(nc, keep, prefix)
    return found


async def test_the_first_read_is_whole_without_a_window(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, tools=("greet", "wave"))]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.start("n2", module_folder(tmp_path, "beta"))
    await m.bundle_state("n1", "alpha/tools", "ready")
    await m.bundle_state("n2", "beta/tools", "ready")
    # The nodes' writes follow their states by a round (50 ms): wait until the bucket has them.
    with anyio.fail_after(5):
        while len([v for k, v in (await stored(m.nc)).items() if ".state." in k and v and b'"tools":' in v]) < 2:
            await anyio.sleep(0.02)
    watcher = CatalogWatcher(m.nc)
    await watcher.read_once()  # no window: the read says when it is whole
    assert tools_of(watcher) == {
        ("mesh.tool.alpha.greet", "n1", "ready"),
        ("mesh.tool.alpha.wave", "n1", "ready"),
        ("mesh.tool.beta.greet", "n2", "ready"),
    }
    greet = watcher.tools_of("mesh.tool.alpha.greet")[0]
    assert (greet.kind, greet.module, greet.tool, greet.bundle) == ("tool", "alpha", "greet", "alpha/tools")
    assert msgspec.json.decode(greet.definition_json())["name"] == "greet"
    nodes = {n.node: n for n in watcher.nodes()}
    assert nodes["n1"].service == m.nodes["n1"].serving.service.id  # type: ignore[union-attr]
    assert [b.state for b in nodes["n2"].bundles] == ["ready"]
    # The face's input today, from the catalogue: INFO answers' shape, the same facts.
    infos = {i["metadata"]["node"]: i for i in watcher.infos()}
    endpoint = next(e for e in infos["n1"]["endpoints"] if e["subject"] == "mesh.tool.alpha.wave")
    assert endpoint["metadata"]["bundle"] == "alpha/tools" and endpoint["metadata"]["state"] == "ready"
    assert msgspec.json.decode(endpoint["metadata"]["mcp_tool"])["name"] == "wave"


async def test_a_restart_writes_its_state_and_never_its_definitions(m: Mesh, tmp_path: Path, w: Watching) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await w.until("alpha ready", lambda c: ("mesh.tool.alpha.greet", "n1", "ready") in tools_of(c))
    written: list[str] = []

    async def note(msg: Any) -> None:
        written.append(msg.subject)

    sub = await m.nc.subscribe("mesh.catalog.n1.>", cb=note)
    before = len(w.changes)
    reply = await m.nc.request(node_subject("n1", RESTART), encode(RestartAsk("alpha/tools")), timeout=2)
    assert b'"ok":true' in reply.data
    await w.until(
        "the restart seen", lambda c: any(b.restarts == 1 and b.state == "ready" for b in c.nodes()[0].bundles)
    )
    await w.until("told of it", lambda c: len(w.changes) > before)  # the node's state records changed
    assert "n1" in w.changes[-1][1].nodes
    await sub.unsubscribe()
    assert any(".state.alpha.tools" in s for s in written)
    assert not [s for s in written if ".defs." in s], written  # the same tools: not written again


async def test_a_new_tool_list_is_written_beside_the_old_then_the_old_is_purged(
    m: Mesh, tmp_path: Path, script: Script, w: Watching
) -> None:
    script.modules["alpha"] = [
        Behaviour(answer=echo, tools=("greet",)),
        Behaviour(answer=echo, tools=("greet", "wave")),
    ]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await w.until("greet", lambda c: ("mesh.tool.alpha.greet", "n1", "ready") in tools_of(c))
    old = [k for k, v in (await stored(m.nc, "n1.defs.>")).items() if v]
    await m.nc.request(node_subject("n1", RESTART), encode(RestartAsk("alpha/tools")), timeout=2)
    await w.until("wave", lambda c: ("mesh.tool.alpha.wave", "n1", "ready") in tools_of(c))
    with anyio.fail_after(5):
        while True:
            now = await stored(m.nc, "n1.defs.>")
            if [k for k, v in now.items() if v] != old and all(now.get(k) is None for k in old):
                break
            await anyio.sleep(0.02)
    assert len([k for k, v in now.items() if v]) == 1  # one part of the new list; the old key is a tombstone


async def test_a_clean_stop_takes_the_node_out_at_once(m: Mesh, tmp_path: Path, w: Watching) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await m.start("n2", module_folder(tmp_path, "alpha"))
    await w.until("both", lambda c: {t.node for t in c.tools_of("mesh.tool.alpha.greet")} == {"n1", "n2"})
    await m.stop("n2")
    await w.until("n2 gone", lambda c: [t.node for t in c.tools_of("mesh.tool.alpha.greet")] == ["n1"], timeout=2)
    assert [n.node for n in w.watcher.nodes()] == ["n1"]
    left = {k: v for k, v in (await stored(m.nc, "n2.>")).items() if v is not None}
    assert left == {}  # every key of n2 purged (tombstones expire by themselves)


async def _fake_node(nc: Client, name: str, beat_ttl: int, tools: list[ToolDef], module: str = "ghost") -> None:
    """A node's entries written straight into the bucket, as a node that then dies would leave them."""
    js = nc.jetstream()
    from runtime.wire.catalog import split_definitions

    split = split_definitions(module, "tools", tools)
    for i, part in enumerate(split.parts):
        await js.publish(stored_subject(defs_key(name, module, "tools", split.digest, i)), part)
    state = StateRecord(module, "tools", "0.1.0", "ready", split.digest, len(split.parts), split.tools)
    await js.publish(stored_subject(state_key(name, module, "tools")), encode(state))
    record = NodeRecord(name, "run1", "SVC1", 1.0, float(beat_ttl), time.time(), bundles=[f"{module}/tools"])
    await js.publish(stored_subject(node_key(name)), encode(record))
    await js.publish(stored_subject(beat_key(name)), encode(BeatRecord("run1")), msg_ttl=beat_ttl)


def tool(module: str, name: str) -> ToolDef:
    return ToolDef(f"mesh.tool.{module}.{name}", "tool", name, msgspec.Raw(encode_tool(name)))


def encode_tool(name: str) -> bytes:
    return msgspec.json.encode({"name": name, "inputSchema": {"type": "object"}})


async def test_a_node_that_stops_beating_is_dropped_when_its_beat_expires(m: Mesh, tmp_path: Path, w: Watching) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))  # makes the bucket
    await w.until("n1", lambda c: bool(c.tools_of("mesh.tool.alpha.greet")))
    await _fake_node(m.nc, "ghost-node", 1, [tool("ghost", "boo")])
    await w.until("the ghost", lambda c: bool(c.tools_of("mesh.tool.ghost.boo")))
    seen = time.monotonic()
    # The server removes the beat after its TTL and its marker reaches the watcher.
    await w.until("the ghost gone", lambda c: not c.tools_of("mesh.tool.ghost.boo"), timeout=5)
    assert time.monotonic() - seen < 3
    gone = [c for _, c in w.changes if "ghost-node" in c.nodes]
    assert gone and "mesh.tool.ghost.boo" in gone[-1].subjects


async def test_hostile_entries_are_left_out_and_said(m: Mesh, tmp_path: Path, w: Watching) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await w.until("n1", lambda c: bool(c.tools_of("mesh.tool.alpha.greet")))
    js = m.nc.jetstream()
    # A part claiming another module's subject, and one whose definition is named otherwise.
    claim = ToolDef("mesh.tool.alpha.greet", "tool", "greet", msgspec.Raw(encode_tool("greet")))
    await _fake_node(m.nc, "liar", 30, [tool("liar", "ok")], module="liar")
    bad = DefsPart("liar", "tools", "0123456789abcdef", 0, 1, [claim])
    await js.publish(stored_subject(defs_key("liar", "liar", "tools", "0123456789abcdef", 0)), encode(bad))
    misnamed = DefsPart(
        "liar",
        "tools",
        "fedcba9876543210",
        0,
        1,
        [ToolDef("mesh.tool.liar.x", "tool", "x", msgspec.Raw(b'{"name":"y"}'))],
    )
    await js.publish(stored_subject(defs_key("liar", "liar", "tools", "fedcba9876543210", 0)), encode(misnamed))
    await js.publish(stored_subject("liar.node.extra"), b"{}")  # not a catalogue key
    await js.publish(stored_subject(node_key("other")), encode(NodeRecord("n1", "r", "s", 1.0, 3.0, 0.0)))
    await js.publish(stored_subject(state_key("liar", "zzz", "tools")), b"not json")
    await w.until("the liar's good tool", lambda c: bool(c.tools_of("mesh.tool.liar.ok")))
    await w.until("notes", lambda c: len(c.notes) >= 5)
    notes = "\n".join(w.watcher.notes)
    assert "not mesh.tool.liar.<tool>" in notes
    assert "named 'y', not 'x'" in notes
    assert "not a catalogue key" in notes
    assert "a node record naming node 'n1'" in notes
    assert "not a state record" in notes
    assert [t.node for t in w.watcher.tools_of("mesh.tool.alpha.greet")] == ["n1"]


async def test_a_lost_write_makes_the_watcher_read_the_bucket_again(m: Mesh, tmp_path: Path, w: Watching) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await w.until("n1", lambda c: bool(c.tools_of("mesh.tool.alpha.greet")))
    assert w.watcher.stats.resyncs == 0
    # A republished write whose sequence jumps ahead, as after messages lost on the way; it names
    # a key the bucket does not have, which the read again finds gone.
    seq = (w.watcher._next_seq or 1) + 1000
    headers = {
        "Nats-Stream": "KV_mesh-catalog",
        "Nats-Subject": stored_subject(beat_key("phantom")),
        "Nats-Sequence": str(seq),
    }
    await m.nc.publish("mesh.catalog.phantom.beat", encode(BeatRecord("x")), headers=headers)
    await w.until("the read again", lambda c: c.stats.resyncs == 1, timeout=2)
    assert "phantom.beat" not in w.watcher._seqs
    assert [t.node for t in w.watcher.tools_of("mesh.tool.alpha.greet")] == ["n1"]


async def test_a_watcher_started_before_any_node_fills_as_they_come(m: Mesh, tmp_path: Path, w: Watching) -> None:
    assert w.watcher.ready and w.watcher.tools() == [] and "no catalogue on this bus" in w.watcher.absent
    await m.start("n1", module_folder(tmp_path, "alpha"))
    await w.until("n1", lambda c: ("mesh.tool.alpha.greet", "n1", "ready") in tools_of(c))


async def test_status_and_the_catalogue_say_the_nodes_cluster(m: Mesh, tmp_path: Path, w: Watching) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    status = await m.status("n1")
    assert status.server  # a lone server has a name and no cluster
    await w.until("n1", lambda c: bool(c.nodes()))
    node = w.watcher.nodes()[0]
    assert (node.cluster, node.server) == (status.cluster, status.server)


async def test_a_node_back_after_a_crash_writes_its_unchanged_definitions_no_more(
    m: Mesh, tmp_path: Path, w: Watching
) -> None:
    folder = module_folder(tmp_path, "alpha")
    await m.start("n1", folder)
    await w.until("n1", lambda c: ("mesh.tool.alpha.greet", "n1", "ready") in tools_of(c))
    first_run = w.watcher.nodes()[0].run
    task = m._tasks["n1"]
    task.cancel()  # gone without its clean stop: its keys stay, its beat would expire
    await asyncio.gather(task, return_exceptions=True)
    written: list[str] = []

    async def note(msg: Any) -> None:
        written.append(msg.subject)

    sub = await m.nc.subscribe("mesh.catalog.n1.>", cb=note)
    await m.start("n1", folder)
    await w.until(
        "the new run",
        lambda c: bool(c.nodes()) and c.nodes()[0].run != first_run and bool(c.tools_of("mesh.tool.alpha.greet")),
    )
    await w.until("ready", lambda c: ("mesh.tool.alpha.greet", "n1", "ready") in tools_of(c))
    await sub.unsubscribe()
    assert "mesh.catalog.n1.node" in written and "mesh.catalog.n1.beat" in written
    assert not [s for s in written if ".defs." in s], written  # read back from the bucket, found the same


async def test_a_node_catalogues_its_bound_of_tools_and_says_what_it_left_out(
    m: Mesh, tmp_path: Path, script: Script, w: Watching, caplog: pytest.LogCaptureFixture
) -> None:
    script.modules["many"] = [Behaviour(answer=echo, tools=tuple(f"t{i:04}" for i in range(MAX_TOOLS_PER_NODE + 5)))]
    await m.start("n1", module_folder(tmp_path, "many"))
    await w.until("the bound", lambda c: len(c.tools()) == MAX_TOOLS_PER_NODE, timeout=10)
    state = w.watcher.nodes()[0].bundles[0]
    assert (state.tools, state.left_out) == (MAX_TOOLS_PER_NODE, 5)
    errors = [
        r.getMessage() for r in caplog.records if r.levelname == "ERROR" and "not in the catalogue" in r.getMessage()
    ]
    assert len(errors) == 1 and "5 tools are served but not in the catalogue" in errors[0], errors
    body, code = await m.call(f"mesh.tool.many.t{MAX_TOOLS_PER_NODE + 4:04}", {})
    assert code is None  # served all the same: the catalogue's bound is the listing's, not the calls'


async def test_a_node_is_in_the_catalogue_when_it_says_it_serves(m: Mesh, tmp_path: Path) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))  # returns once the node says it serves
    found = await read_catalog(m.nc)
    assert [n.node for n in found.nodes()] == ["n1"] and [b.bundle for b in found.nodes()[0].bundles] == ["tools"]
