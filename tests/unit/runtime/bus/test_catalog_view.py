"""What a reader holds of the catalogue (runtime/bus/catalog_view.py), fed entries by hand: no server."""

from __future__ import annotations

import itertools

import msgspec

from runtime.bus.catalog import Entry
from runtime.bus.catalog_view import CatalogView, WatchLimits
from runtime.meshctl.face.catalog import Catalog, Selection
from runtime.wire.catalog import (
    BeatRecord,
    NodeRecord,
    StateRecord,
    ToolDef,
    beat_key,
    defs_key,
    encode,
    node_key,
    split_definitions,
    state_key,
)

_seq = itertools.count(1)


def tool(module: str, name: str, pad: int = 0) -> ToolDef:
    definition = {"name": name, "description": "d" * pad, "inputSchema": {"type": "object"}}
    return ToolDef(f"mesh.tool.{module}.{name}", "tool", name, msgspec.Raw(msgspec.json.encode(definition)))


def put(view: CatalogView, key: str, value: bytes | None, seq: int | None = None) -> Entry:
    entry = Entry(key, next(_seq) if seq is None else seq, value)
    view.apply(entry)
    return entry


def node(
    view: CatalogView,
    name: str,
    module: str = "alpha",
    tools: tuple[str, ...] = ("greet",),
    state: str = "ready",
    run: str = "r1",
    beat: bool = True,
    cluster: str = "east",
    pad: int = 0,
) -> list[Entry]:
    """Every entry a node writes, in the order it writes them."""
    split = split_definitions(module, "tools", [tool(module, t, pad) for t in tools])
    written = [put(view, defs_key(name, module, "tools", split.digest, i), part) for i, part in enumerate(split.parts)]
    record = StateRecord(module, "tools", "0.1.0", state, split.digest, len(split.parts), split.tools)
    written.append(put(view, state_key(name, module, "tools"), encode(record)))
    node_record = NodeRecord(name, run, f"svc-{name}", 5.0, 15.0, 0.0, cluster=cluster, bundles=[f"{module}/tools"])
    written.append(put(view, node_key(name), encode(node_record)))
    if beat:
        written.append(put(view, beat_key(name), encode(BeatRecord(run))))
    return written


def shown(view: CatalogView) -> set[tuple[str, str, str]]:
    return {(t.subject, t.node, t.state) for t in view.tools()}


def test_a_node_is_listed_once_its_beat_is_there() -> None:
    view = CatalogView()
    node(view, "n1", beat=False)
    view.take_change()
    assert view.tools() == []  # no beat: not live
    put(view, beat_key("n1"), encode(BeatRecord("r1")))
    change = view.take_change()
    assert shown(view) == {("mesh.tool.alpha.greet", "n1", "ready")}
    assert change is not None and change.nodes == {"n1"} and change.subjects == {"mesh.tool.alpha.greet"}
    t = view.tools()[0]
    assert (t.cluster, t.bundle, t.kind, t.module) == ("east", "alpha/tools", "tool", "alpha")


def test_a_newer_entry_wins_whatever_the_order_they_come_in() -> None:
    view = CatalogView()
    node(view, "n1")
    key = state_key("n1", "alpha", "tools")
    split = split_definitions("alpha", "tools", [tool("alpha", "greet")])
    newer = encode(StateRecord("alpha", "tools", "0.1.0", "backoff", split.digest, 1, 1))
    older = encode(StateRecord("alpha", "tools", "0.1.0", "starting", split.digest, 1, 1))
    put(view, key, newer, seq=1000)
    put(view, key, older, seq=999)  # a read's older copy, after the republished newer one
    view.take_change()
    assert shown(view) == {("mesh.tool.alpha.greet", "n1", "backoff")}


def test_a_deletion_seen_while_a_read_runs_is_not_undone_by_the_read() -> None:
    view = CatalogView()
    node(view, "n1")
    view.take_change()
    view.begin_read()
    put(view, beat_key("n1"), None, seq=5000)  # the node left: its beat purged (republished)
    view.read(Entry(beat_key("n1"), 4000, encode(BeatRecord("r1"))))  # the read's older copy
    view.end_read(again=True)
    view.take_change()
    assert view.tools() == []


def test_a_read_again_drops_what_the_bucket_no_longer_has() -> None:
    view = CatalogView()
    kept = node(view, "n1")
    node(view, "n2")
    view.take_change()
    view.begin_read()
    for entry in kept:  # the read finds n1's keys only: n2's expired while messages were lost
        view.read(entry)
    view.end_read(again=True)
    change = view.take_change()
    assert {t.node for t in view.tools()} == {"n1"}
    assert change is not None and change.nodes == {"n2"}
    assert not [k for k in view._seqs if k.startswith("n2.")]


def test_a_list_shared_by_many_nodes_is_held_once() -> None:
    view = CatalogView()
    for i in range(100):
        node(view, f"n{i}", tools=tuple(f"t{j}" for j in range(20)), pad=500)
    view.take_change()
    assert len(view.tools()) == 2000 and len(view.subjects()) == 20
    assert len(view._parts) == 1  # one list, 100 nodes
    one_list = next(iter(view._parts.values())).size
    assert view.stats.bytes < one_list + 100 * 1000  # the list once, and small records per node
    assert view.stats.tools == 2000


def test_past_a_bound_entries_are_left_out_and_said_once() -> None:
    view = CatalogView(WatchLimits(max_tools=30))
    node(view, "n1", tools=tuple(f"t{j}" for j in range(20)))
    node(view, "n2", tools=tuple(f"t{j}" for j in range(20)))
    view.take_change()
    assert {t.node for t in view.tools()} == {"n1"} and view.stats.tools == 20
    assert view.stats.left_out == 1 and "holds 30 tools at most" in view.notes[-1]
    node(view, "n2", tools=tuple(f"t{j}" for j in range(20)))  # written again: refused again, said once
    assert len([n for n in view.notes if "30 tools" in n]) == 1


def test_a_restarted_node_does_not_go_and_come_back_between_its_record_and_its_beat() -> None:
    view = CatalogView()
    node(view, "n1", run="r1")
    view.take_change()
    record = NodeRecord("n1", "r2", "svc-n1b", 5.0, 15.0, 0.0, cluster="east", bundles=["alpha/tools"])
    put(view, node_key("n1"), encode(record))  # the new run's record, the old run's beat still there
    change = view.take_change()
    assert shown(view) == {("mesh.tool.alpha.greet", "n1", "ready")}
    assert change is not None and change.subjects == frozenset() and change.nodes == {"n1"}


def test_a_beat_written_again_changes_nothing_a_face_shows() -> None:
    view = CatalogView()
    node(view, "n1")
    view.take_change()
    put(view, beat_key("n1"), encode(BeatRecord("r1")))
    assert view.take_change() is None
    put(view, state_key("n1", "alpha", "tools"), _restarted(view))
    change = view.take_change()
    assert change is not None and change.subjects == frozenset() and change.nodes == {"n1"}  # restarts counted


def _restarted(view: CatalogView) -> bytes:
    state = next(iter(view._nodes["n1"].states.values()))
    return encode(msgspec.structs.replace(state, restarts=state.restarts + 1))


def test_a_beat_not_written_again_within_its_ttl_drops_the_node() -> None:
    view = CatalogView()
    node(view, "n1")
    view.take_change()
    seen = view._nodes["n1"].beat_seen
    assert not view.sweep(seen + 15)  # within its TTL (and a beat's grace)
    assert view.sweep(seen + 21)
    change = view.take_change()
    assert view.tools() == [] and change is not None and change.subjects == {"mesh.tool.alpha.greet"}


def test_the_faces_catalog_reads_the_views_infos_as_it_reads_srv_info() -> None:
    view = CatalogView()
    node(view, "n1", tools=("greet", "wave"))
    node(view, "n2", tools=("greet", "wave"), state="backoff")
    node(view, "n3", module="beta")
    view.take_change()
    catalog = Catalog(Selection())
    assert catalog.rebuild(view.infos())
    assert [(t.name, t.nodes, t.states) for t in catalog.tools] == [
        ("alpha_greet", ("n1", "n2"), ("ready", "backoff")),
        ("alpha_wave", ("n1", "n2"), ("ready", "backoff")),
        ("beta_greet", ("n3",), ("ready",)),
    ]
    assert catalog.by_name["alpha_wave"].definition == {"name": "alpha_wave", "inputSchema": {"type": "object"}}
