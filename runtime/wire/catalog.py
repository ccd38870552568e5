"""The catalogue: what every node serves, kept by the bus in the JetStream KV bucket `mesh-catalog`.

Each node writes its own keys only, each when what it says changed (runtime/node/catalog.py);
faces and `meshctl tools` read the bucket once and then follow its changes (runtime/bus/catalog.py).
docs/scale.md says why and what it costs. Keys, under the node's name:

    <node>.node                                 NodeRecord: cluster, server, Service API id, run, seats, bundles
    <node>.beat                                 BeatRecord, every `beat_s`, with a per-message TTL of `beat_ttl_s`
    <node>.state.<module>.<bundle>              StateRecord: the bundle's state and which definitions are its own
    <node>.defs.<module>.<bundle>.<digest>.<i>  DefsPart i of `parts`: the bundle's tools, as served

A node is live while its beat is there: a node that dies stops beating, and the server removes
the beat after its TTL (and says so with a marker every watcher gets). Definitions are keyed by
their digest: a new list is written beside the old, the state record then points at it, the old
keys are purged; a reader never sees half of a bundle's list. Everything but the beat carries
a long TTL too (`ENTRY_TTL_S`, rewritten after half of it), so what a node that never came back
wrote is gone within a day, and the bucket never grows with the mesh's history.

Every value from the bus is hostile until checked: `check_*` say what is wrong with a record, and
a reader leaves out what they refuse. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from manifests.model import NAME_RE
from runtime.wire.subjects import CATALOG_BUCKET, CATALOG_PREFIX, SEAT_PREFIX, TOOL_PREFIX

FORMAT = 1  # of every record; a reader leaves out a record of a later format (and says so)

# --- bounds -------------------------------------------------------------------------------
# One value of the bucket, at most (the bucket's max_msg_size: the server refuses more).
MAX_ENTRY_BYTES = 256 * 1024
# A node, state or beat record: small, and never carrying a definition.
MAX_RECORD_BYTES = 16 * 1024
# What a part's envelope (module, bundle, digest, numbers) may take beside its tools.
PART_ENVELOPE_BYTES = 1024
# One tool (subject, names and definition) in a part: a bigger one is not catalogued.
MAX_TOOL_BYTES = MAX_ENTRY_BYTES - PART_ENVELOPE_BYTES
MAX_PARTS = 16  # parts of one bundle's list: 4 MiB of definitions at most
MAX_TOOLS_PER_NODE = 1000  # tools one node catalogues; past it a bundle's tools are left out (ERROR)
MAX_BUNDLES_PER_NODE = 256  # bundles named in a node record
MAX_SEATS_PER_NODE = 256  # seats named in a node record
MAX_SUBJECT = 512  # characters of a subject
MAX_STATE = 32  # characters of a state

# --- time ---------------------------------------------------------------------------------
BEAT_S = 5.0  # a node's heartbeat
BEAT_TTL_S = 15  # a beat's per-message TTL: a node that stopped beating is gone after it (3 beats)
ENTRY_TTL_S = 24 * 3600  # every other entry's TTL: what a node that never came back wrote expires
REFRESH_S = ENTRY_TTL_S // 2  # an unchanged entry is written again after this, before it expires
TOMBSTONE_TTL_S = 600  # a purge's marker: watchers hear of it, then it is gone from the bucket
MARKER_TTL_S = 600  # the server's marker of an expired beat (the stream's subject_delete_marker_ttl)

STREAM = f"KV_{CATALOG_BUCKET}"  # the bucket's stream
STORED_PREFIX = f"$KV.{CATALOG_BUCKET}."  # a key's subject in the stream
BUCKET_MAX_BYTES = 1024 * 1024 * 1024  # the whole bucket: 1,000 nodes x 50 tools take about 40 MB

NODE, BEAT, STATE, DEFS = "node", "beat", "state", "defs"
_DIGEST_RE = re.compile(r"^[0-9a-f]{16}\Z")
_PART_RE = re.compile(r"^(0|[1-9][0-9]?)\Z")
_BAD_SUBJECT_CHARS = frozenset(" *>\t\r\n")


# --- keys ---------------------------------------------------------------------------------
def node_key(node: str) -> str:
    return f"{node}.{NODE}"


def beat_key(node: str) -> str:
    return f"{node}.{BEAT}"


def state_key(node: str, module: str, bundle: str) -> str:
    return f"{node}.{STATE}.{module}.{bundle}"


def defs_key(node: str, module: str, bundle: str, digest: str, part: int) -> str:
    return f"{node}.{DEFS}.{module}.{bundle}.{digest}.{part}"


def defs_prefix(node: str, module: str, bundle: str) -> str:
    """What every key of a bundle's lists begins with, whatever their digest."""
    return f"{node}.{DEFS}.{module}.{bundle}."


def own_keys(node: str) -> str:
    """Every key of one node (a filter)."""
    return f"{node}.>"


def stored_subject(key: str) -> str:
    return STORED_PREFIX + key


def live_subject(key: str) -> str:
    """Where the server republishes a write of `key` (the stream's republish)."""
    return CATALOG_PREFIX + key


@dataclass(frozen=True, slots=True)
class Key:
    """A key, read back: which node, what kind, and for a bundle's keys which one."""

    node: str
    kind: str  # node | beat | state | defs
    module: str = ""
    bundle: str = ""
    digest: str = ""
    part: int = 0


def parse_key(key: str) -> Key | None:
    """The key's parts, or None when it is not a catalogue key (names by the manifest's rule)."""
    tokens = key.split(".")
    if len(tokens) < 2 or not NAME_RE.match(tokens[0]):
        return None
    node, kind = tokens[0], tokens[1]
    if kind in (NODE, BEAT) and len(tokens) == 2:
        return Key(node, kind)
    if kind == STATE and len(tokens) == 4 and NAME_RE.match(tokens[2]) and NAME_RE.match(tokens[3]):
        return Key(node, kind, tokens[2], tokens[3])
    if (
        kind == DEFS
        and len(tokens) == 6
        and NAME_RE.match(tokens[2])
        and NAME_RE.match(tokens[3])
        and _DIGEST_RE.match(tokens[4])
        and _PART_RE.match(tokens[5])
    ):
        return Key(node, kind, tokens[2], tokens[3], tokens[4], int(tokens[5]))
    return None


# --- records ------------------------------------------------------------------------------
class SeatRecord(msgspec.Struct, frozen=True):
    seat: str
    module: str
    state: str  # held | elsewhere | refused | starting
    holder: str = ""  # the node that holds it, when another one does


class NodeRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    node: str
    run: str  # the node process's run id: a restarted node is another run
    service: str  # its Service API id, as in its $SRV.INFO answer
    beat_s: float
    beat_ttl_s: float
    started: float  # unix time the run began
    cluster: str = ""  # the NATS cluster of the server the node is connected to ("" standalone)
    server: str = ""  # that server's name
    domain: str = ""  # its JetStream domain, when it has one
    seats: list[SeatRecord] = []
    bundles: list[str] = []  # "<module>/<bundle>" of every tools bundle it runs
    format: int = FORMAT


class BeatRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    run: str
    format: int = FORMAT


class StateRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    module: str
    bundle: str
    version: str  # the module's
    state: str  # the bundle's, as the node's status shows it
    digest: str = ""  # its current definitions ("" while it has none)
    parts: int = 0
    tools: int = 0
    restarts: int = 0
    left_out: int = 0  # tools served but not catalogued (a bound was hit; the node said so in an ERROR)
    format: int = FORMAT


class ToolDef(msgspec.Struct, frozen=True):
    """One served tool: where it is called, and its MCP definition as the bundle listed it."""

    subject: str
    kind: str  # tool | seat
    tool: str
    definition: msgspec.Raw  # a JSON object, the MCP Tool


class DefsPart(msgspec.Struct, frozen=True):
    module: str
    bundle: str
    digest: str
    part: int
    parts: int
    tools: list[ToolDef]
    format: int = FORMAT


_encode = msgspec.json.encode


def encode(record: msgspec.Struct) -> bytes:
    return _encode(record)


# --- the writer's side: a bundle's tools into parts ----------------------------------------
@dataclass(frozen=True)
class Split:
    """A bundle's tools as parts of at most MAX_ENTRY_BYTES, and what could not be catalogued."""

    digest: str
    parts: list[bytes]
    tools: int
    left_out: list[str]  # "<tool>: why", each said by the node in an ERROR


def split_definitions(module: str, bundle: str, tools: list[ToolDef], room: int = MAX_TOOLS_PER_NODE) -> Split:
    """The parts of one bundle's list (sorted by subject); `room`: tools this node may still catalogue."""
    encoded: list[tuple[ToolDef, bytes]] = []
    left_out: list[str] = []
    for t in sorted(tools, key=lambda t: t.subject):
        data = _encode(t)
        if len(data) > MAX_TOOL_BYTES:
            left_out.append(f"{t.tool}: its definition takes {len(data)} bytes, more than {MAX_TOOL_BYTES}")
        elif len(encoded) >= room:
            left_out.append(f"{t.tool}: the node catalogues {MAX_TOOLS_PER_NODE} tools at most")
        else:
            encoded.append((t, data))
    groups: list[list[ToolDef]] = []
    size = MAX_TOOL_BYTES + 1  # the first tool opens a part
    for t, data in encoded:
        if size + len(data) + 1 > MAX_TOOL_BYTES:
            if len(groups) == MAX_PARTS:
                left_out.append(
                    f"{t.tool}: the bundle's list is longer than {MAX_PARTS} parts of {MAX_ENTRY_BYTES} bytes"
                )
                continue
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += len(data) + 1
    kept = [t for group in groups for t in group]
    digest = definitions_digest(kept)
    parts = [_encode(DefsPart(module, bundle, digest, i, len(groups), group)) for i, group in enumerate(groups)]
    return Split(digest if kept else "", parts, len(kept), left_out)


def definitions_digest(tools: list[ToolDef]) -> str:
    """16 hex digits of what the list says: the same tools give the same keys, on any node."""
    h = hashlib.sha256()
    for t in tools:
        h.update(_encode(t))
        h.update(b"\n")
    return h.hexdigest()[:16]


# --- the reader's side: hostile values checked ---------------------------------------------
class _Named(msgspec.Struct):
    name: str


_decode_named = msgspec.json.Decoder(_Named).decode
_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    NODE: msgspec.json.Decoder(NodeRecord),
    BEAT: msgspec.json.Decoder(BeatRecord),
    STATE: msgspec.json.Decoder(StateRecord),
    DEFS: msgspec.json.Decoder(DefsPart),
}


class Refused(Exception):
    """A value that is not what its key says (a reader leaves it out and says so once)."""


def decode(key: Key, value: bytes) -> NodeRecord | BeatRecord | StateRecord | DefsPart:
    """The record under `key`, checked against it; Refused says what is wrong."""
    bound = MAX_ENTRY_BYTES if key.kind == DEFS else MAX_RECORD_BYTES
    if len(value) > bound:
        raise Refused(f"{len(value)} bytes, more than {bound}")
    try:
        record: NodeRecord | BeatRecord | StateRecord | DefsPart = _decoders[key.kind].decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Refused(f"not a {key.kind} record ({e})") from None
    if record.format > FORMAT:
        raise Refused(f"format {record.format} (this reader knows {FORMAT}; a node newer than it)")
    if isinstance(record, NodeRecord):
        _check_node(key, record)
    elif isinstance(record, StateRecord):
        _check_state(key, record)
    elif isinstance(record, DefsPart):
        _check_part(key, record)
    return record


def _check_node(key: Key, record: NodeRecord) -> None:
    if record.node != key.node:
        raise Refused(f"a node record naming node {record.node[:64]!r}")
    if not (0 < record.beat_s <= 3600 and record.beat_s <= record.beat_ttl_s <= 3 * 3600):
        raise Refused(f"beat every {record.beat_s} s with a TTL of {record.beat_ttl_s} s")
    if len(record.seats) > MAX_SEATS_PER_NODE or len(record.bundles) > MAX_BUNDLES_PER_NODE:
        raise Refused(f"{len(record.seats)} seats and {len(record.bundles)} bundles")


def _check_state(key: Key, record: StateRecord) -> None:
    if (record.module, record.bundle) != (key.module, key.bundle):
        raise Refused(f"the state of {record.module[:64]}/{record.bundle[:64]}")
    if not record.state or len(record.state) > MAX_STATE:
        raise Refused(f"state {record.state[:40]!r}")
    if record.digest and not _DIGEST_RE.match(record.digest):
        raise Refused(f"digest {record.digest[:40]!r}")
    if not 0 <= record.parts <= MAX_PARTS or not 0 <= record.tools <= MAX_TOOLS_PER_NODE:
        raise Refused(f"{record.parts} parts of {record.tools} tools")


def _check_part(key: Key, part: DefsPart) -> None:
    if (part.module, part.bundle, part.digest, part.part) != (key.module, key.bundle, key.digest, key.part):
        raise Refused("a part whose module, bundle, digest or number is not its key's")
    if not 0 <= part.part < part.parts <= MAX_PARTS:
        raise Refused(f"part {part.part} of {part.parts}")
    for t in part.tools:
        why = tool_problem(key.module, t)
        if why:
            raise Refused(why)


def tool_problem(module: str, t: ToolDef) -> str | None:
    """Why a tool of `module` cannot be listed as it says, or None: its subject is its module's
    own tool or a seat verb, named as the tool; its definition a JSON object with the tool's name."""
    subject = t.subject
    if len(subject) > MAX_SUBJECT or any(c in _BAD_SUBJECT_CHARS for c in subject):
        return f"{subject[:80]!r}: not a subject"
    if t.kind == "tool":
        if subject != f"{TOOL_PREFIX}{module}.{t.tool}":
            return f"{subject[:80]}: not {TOOL_PREFIX}{module}.<tool> with tool {t.tool[:64]!r}"
    elif t.kind == "seat":
        if subject != SEAT_PREFIX + t.tool or t.tool.count(".") != 1 or not all(t.tool.split(".")):
            return f"{subject[:80]}: not {SEAT_PREFIX}<seat>.<verb> with tool {t.tool[:64]!r}"
    else:
        return f"{subject[:80]}: kind {t.kind[:20]!r} is neither tool nor seat"
    try:
        named = _decode_named(t.definition)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return f"{subject}: the definition is not a JSON object with a name"
    if named.name != t.tool:
        return f"{subject}: the definition is named {named.name[:64]!r}, not {t.tool[:64]!r}"
    return None
