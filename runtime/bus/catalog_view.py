"""The catalogue as a reader holds it: entries in, the tools of live nodes out (no I/O).

`apply` takes one entry (read, or republished: runtime/bus/catalog_watch.py) and keeps it when
its stream sequence is newer than what its key holds; `take_change` makes again the views of
the nodes it touched and says what changed. A node is live while its record and its beat are
there; its tools are those of the definitions its bundles' state records point at. Definitions several nodes share (the same list) are held once. Every value is checked
(runtime/wire/catalog.py); what is refused or beyond a bound (`WatchLimits`) is left out and
said once.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.bus.catalog import Entry
from runtime.wire.catalog import (
    BEAT,
    NODE,
    STATE,
    BeatRecord,
    DefsPart,
    NodeRecord,
    Refused,
    SeatRecord,
    StateRecord,
    decode,
    parse_key,
)

log = logging.getLogger("mesh.catalog")

NOTES_KEPT = 256  # notes (what was left out and why) remembered, each said once


@dataclass(frozen=True, slots=True)
class CatalogTool:
    """One tool of one live node: the facts a Service API endpoint's metadata gives, and its cluster."""

    subject: str
    kind: str  # tool | seat
    module: str
    tool: str
    bundle: str  # "<module>/<bundle>", as $SRV.INFO's metadata says
    node: str
    cluster: str
    state: str  # the bundle's state on that node
    definition: msgspec.Raw  # the MCP Tool as the bundle listed it: a JSON object named `tool`

    def definition_json(self) -> bytes:
        return bytes(self.definition)


@dataclass(frozen=True)
class CatalogNode:
    node: str
    cluster: str
    server: str
    service: str  # its Service API id
    run: str
    seats: tuple[SeatRecord, ...]
    bundles: tuple[StateRecord, ...]
    tools: int


@dataclass(frozen=True)
class CatalogChange:
    """What changed since the last call: subjects whose tools changed on any node (definition,
    state, a node coming or going), and the nodes that came, went or changed."""

    subjects: frozenset[str]
    nodes: frozenset[str]
    generation: int


@dataclass(frozen=True)
class WatchLimits:
    """A reader's bounds: past one, entries are left out (said once) until a later read has room."""

    max_keys: int = 200_000
    max_tools: int = 100_000  # tools of all nodes together (one per node and subject)
    max_bytes: int = 256 * 1024 * 1024  # of values held (a definition list shared by nodes once)


@dataclass
class WatchStats:
    keys: int = 0
    tools: int = 0  # tools in the definitions held (all nodes, live or not)
    bytes: int = 0  # of distinct values held
    scans: int = 0  # whole reads of the bucket (the first, and each resync)
    resyncs: int = 0
    left_out: int = 0  # entries refused or beyond a bound
    messages: int = 0  # republished writes taken


class _Part:
    __slots__ = ("part", "refs", "size")

    def __init__(self, part: DefsPart, size: int) -> None:
        self.part, self.refs, self.size = part, 0, size


@dataclass
class _NodeKeys:
    """Everything held of one node's keys."""

    record: NodeRecord | None = None
    beat: BeatRecord | None = None
    beat_seen: float = 0.0  # monotonic time the beat was last written or read
    states: dict[tuple[str, str], StateRecord] = field(default_factory=dict)
    defs: dict[tuple[str, str, str, int], bytes] = field(default_factory=dict)  # -> its value's hash

    def empty(self) -> bool:
        return self.record is None and self.beat is None and not self.states and not self.defs


class CatalogView:
    """What a reader holds of the bucket, and the tools of its live nodes."""

    def __init__(self, limits: WatchLimits = WatchLimits()) -> None:  # noqa: B008 (frozen)
        self.limits = limits
        self.generation = 0
        self.stats = WatchStats()
        self.notes: list[str] = []  # the latest, said once each in a WARNING
        self._seqs: dict[str, int] = {}  # key -> the stream sequence of what is held
        self._tombstones: dict[str, int] = {}  # key -> sequence of its deletion, while a whole read runs
        self._sizes: dict[str, int] = {}  # key -> bytes of its value, for records (parts: in _parts)
        self._nodes: dict[str, _NodeKeys] = {}
        self._parts: dict[bytes, _Part] = {}  # a value's hash -> the part, shared by every key holding it
        self._views: dict[str, dict[str, CatalogTool]] = {}  # live node -> subject -> its tool
        self._by_subject: dict[str, dict[str, CatalogTool]] = {}  # subject -> node -> its tool
        self._facts: dict[str, tuple[object, ...]] = {}  # live node -> its record and state records, as shown
        self._dirty: set[str] = set()
        self._scanning = False  # a whole read runs: deletions are remembered until it ends
        self._before: dict[str, int] = {}  # what was held when the read began
        self._seen: set[str] = set()  # keys the read returned
        self._said: set[str] = set()

    # --- a whole read ---------------------------------------------------------------------------
    def begin_read(self) -> None:
        self._scanning, self._before, self._seen = True, dict(self._seqs), set()

    def read(self, got: Entry | str) -> None:
        """One entry of a whole read (or why one was refused)."""
        if isinstance(got, str):
            self.refuse("", got)
            return
        self._seen.add(got.key)
        self.apply(got)

    def end_read(self, again: bool) -> None:
        """The read is whole: no older write can come after it. `again`: a read after others, so
        what was held before it and neither read again nor written since is gone from the bucket."""
        if again:
            for key, seq in self._before.items():
                if key not in self._seen and self._seqs.get(key) == seq:
                    self._drop(key)
        self._tombstones.clear()
        self._scanning, self._before, self._seen = False, {}, set()
        self._dirty.update(self._nodes)

    def clear(self) -> None:
        """Forget everything (the bucket was made anew: what is held is of the old one)."""
        for raw_key in list(self._seqs):
            self._drop(raw_key)
        self._tombstones.clear()

    # --- what it shows -----------------------------------------------------------------------
    def tools(self) -> list[CatalogTool]:
        """Every tool of every live node, by subject and then node."""
        return [t for subject in sorted(self._by_subject) for t in self.tools_of(subject)]

    def subjects(self) -> list[str]:
        return sorted(self._by_subject)

    def tools_of(self, subject: str) -> list[CatalogTool]:
        """The subject's tool on each live node serving it, by node name."""
        found = self._by_subject.get(subject, {})
        return [found[n] for n in sorted(found)]

    def nodes(self) -> list[CatalogNode]:
        """Every live node."""
        shown = []
        for name in sorted(self._views):
            keys = self._nodes[name]
            record = keys.record
            assert record is not None
            states = tuple(keys.states[k] for k in sorted(keys.states) if "/".join(k) in record.bundles)
            shown.append(
                CatalogNode(
                    name,
                    record.cluster,
                    record.server,
                    record.service,
                    record.run,
                    tuple(record.seats),
                    states,
                    len(self._views[name]),
                )
            )
        return shown

    def infos(self) -> list[dict[str, Any]]:
        """Every live node as a `$SRV.INFO` answer would show it (the shape the MCP face's
        `Catalog.rebuild` reads): the same facts, from the catalogue."""
        answers = []
        for node in self.nodes():
            endpoints = [
                {
                    "name": t.subject.replace(".", "-"),
                    "subject": t.subject,
                    "metadata": {
                        "kind": t.kind,
                        "module": t.module,
                        "tool": t.tool,
                        "bundle": t.bundle,
                        "state": t.state,
                        "mcp_tool": t.definition_json().decode(),
                    },
                }
                for t in sorted(self._views[node.node].values(), key=lambda t: t.subject)
            ]
            held = ",".join(s.seat for s in node.seats if s.state == "held")
            answers.append(
                {
                    "id": node.service,
                    "metadata": {"node": node.node, "seats": held, "cluster": node.cluster},
                    "endpoints": endpoints,
                }
            )
        return answers

    # --- applying entries ------------------------------------------------------------------------
    def apply(self, entry: Entry) -> None:
        """One entry, read or republished: held when it is newer than what its key holds."""
        held = self._seqs.get(entry.key, self._tombstones.get(entry.key))
        if held is not None and held >= entry.seq:
            return  # already held, or newer
        key = parse_key(entry.key)
        if key is None:
            self.refuse(entry.key, "not a catalogue key")
            return
        self._drop(entry.key)
        if entry.value is None:
            if self._scanning:
                self._tombstones[entry.key] = entry.seq  # an older copy may still come in the read
            return
        try:
            record = decode(key, entry.value)
        except Refused as e:
            self.refuse(entry.key, str(e))
            return
        if not self._room(entry, record):
            return
        self._seqs[entry.key] = entry.seq
        keys = self._nodes.setdefault(key.node, _NodeKeys())
        self._dirty.add(key.node)
        if isinstance(record, DefsPart):
            digest = hashlib.sha256(entry.value).digest()
            part = self._parts.get(digest)
            if part is None:
                part = self._parts[digest] = _Part(record, len(entry.value))
                self.stats.bytes += part.size
            part.refs += 1
            self.stats.tools += len(part.part.tools)
            keys.defs[(key.module, key.bundle, key.digest, key.part)] = digest
        else:
            self._sizes[entry.key] = len(entry.value)
            self.stats.bytes += len(entry.value)
            if isinstance(record, NodeRecord):
                keys.record = record
            elif isinstance(record, BeatRecord):
                keys.beat, keys.beat_seen = record, time.monotonic()
            else:
                keys.states[(key.module, key.bundle)] = record
        self.stats.keys = len(self._seqs)

    def _room(self, entry: Entry, record: object) -> bool:
        assert entry.value is not None
        limits = self.limits
        tools = len(record.tools) if isinstance(record, DefsPart) else 0
        why = ""
        if len(self._seqs) >= limits.max_keys:
            why = f"{limits.max_keys} keys"
        elif self.stats.tools + tools > limits.max_tools:
            why = f"{limits.max_tools} tools"
        elif self.stats.bytes + len(entry.value) > limits.max_bytes:
            why = f"{limits.max_bytes} bytes"
        if why:
            self.refuse(entry.key, f"left out: this reader holds {why} at most")
            return False
        return True

    def _drop(self, raw_key: str) -> None:
        """Forget what is held under a key."""
        if self._seqs.pop(raw_key, None) is None:
            return
        self.stats.keys = len(self._seqs)
        key = parse_key(raw_key)
        keys = self._nodes.get(key.node) if key is not None else None
        if key is None or keys is None:
            return
        self._dirty.add(key.node)
        self.stats.bytes -= self._sizes.pop(raw_key, 0)
        if key.kind == NODE:
            keys.record = None
        elif key.kind == BEAT:
            keys.beat = None
        elif key.kind == STATE:
            keys.states.pop((key.module, key.bundle), None)
        else:
            digest = keys.defs.pop((key.module, key.bundle, key.digest, key.part), None)
            part = self._parts.get(digest) if digest is not None else None
            if digest is not None and part is not None:
                part.refs -= 1
                self.stats.tools -= len(part.part.tools)
                if part.refs <= 0:
                    del self._parts[digest]
                    self.stats.bytes -= part.size
        if keys.empty():
            del self._nodes[key.node]

    def sweep(self, now: float) -> bool:
        """A beat not written again within its TTL is gone, marker or not (a marker can be lost).
        `now`: monotonic time; True when a node went."""
        went = False
        for name, keys in self._nodes.items():
            if keys.beat is None or keys.record is None:
                continue
            grace = keys.record.beat_ttl_s + max(keys.record.beat_s, 2.0)
            if now - keys.beat_seen > grace:
                keys.beat = None
                self._dirty.add(name)
                went = True
        return went

    # --- views and changes --------------------------------------------------------------------
    def _view_of(self, name: str) -> dict[str, CatalogTool] | None:
        """The node's tools while it is live: its record and its beat are there. (A beat of the run
        before a restart counts too: the new run's record comes first, its beat right after, and a
        face should not see the node go and come back between the two.)"""
        keys = self._nodes.get(name)
        if keys is None or keys.record is None or keys.beat is None:
            return None
        record = keys.record
        tools: dict[str, CatalogTool] = {}
        for bundle_key in record.bundles:
            module, _, bundle = bundle_key.partition("/")
            state = keys.states.get((module, bundle))
            if state is None or not state.digest:
                continue
            for i in range(state.parts):
                digest = keys.defs.get((module, bundle, state.digest, i))
                part = self._parts.get(digest) if digest is not None else None
                if part is None:
                    continue  # not written yet, or left out: the rest of the list still shows
                for t in part.part.tools:
                    if t.subject not in tools:
                        tools[t.subject] = CatalogTool(
                            t.subject,
                            t.kind,
                            module,
                            t.tool,
                            bundle_key,
                            name,
                            record.cluster,
                            state.state,
                            t.definition,
                        )
        return tools

    def take_change(self) -> CatalogChange | None:
        """The views of the nodes touched since the last call, made again; what changed in them."""
        subjects: set[str] = set()
        nodes: set[str] = set()
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            old = self._views.get(name)
            new = self._view_of(name)
            if new is None:
                self._views.pop(name, None)
            else:
                self._views[name] = new
            before = old or {}
            after = new or {}
            changed = {s for s in before.keys() | after.keys() if before.get(s) != after.get(s)}
            facts = self._facts_of(name) if new is not None else None
            if changed or facts != self._facts.get(name):
                nodes.add(name)  # came, went, or its record or a bundle's state record changed
            if facts is None:
                self._facts.pop(name, None)
            else:
                self._facts[name] = facts
            for s in changed:
                subjects.add(s)
                by_node = self._by_subject.setdefault(s, {})
                if s in after:
                    by_node[name] = after[s]
                else:
                    by_node.pop(name, None)
                    if not by_node:
                        del self._by_subject[s]
        if not subjects and not nodes:
            return None
        self.generation += 1
        return CatalogChange(frozenset(subjects), frozenset(nodes), self.generation)

    def _facts_of(self, name: str) -> tuple[object, ...]:
        keys = self._nodes[name]
        return (keys.record, *sorted(keys.states.items()))

    def refuse(self, key: str, why: str) -> None:
        self.stats.left_out += 1
        self.note(f"catalogue entry {key[:120]}: {why}" if key else f"catalogue: {why}")

    def note(self, note: str) -> None:
        if note in self._said:
            return
        if len(self._said) >= NOTES_KEPT:
            self._said.clear()
        self._said.add(note)
        self.notes = (self.notes + [note])[-NOTES_KEPT:]
        log.warning("%s", note)
