"""The tools a client of the face sees: every node's `$SRV.INFO` answer, checked, named, chosen.

Every string from the bus is hostile until checked: an endpoint whose subject is not a mesh
tool or seat subject, whose definition is not a JSON object with the endpoint's tool name, or
that is larger than `MAX_DEFINITION` is left out (and said once). The same subject on several
nodes is one tool; when their definitions differ (an upgrade rolling through), the one of the
node whose name sorts first is shown, so every face shows the same.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from runtime.meshctl.face.names import assign_names
from runtime.wire.subjects import SEAT_PREFIX, TOOL_PREFIX

log = logging.getLogger("mesh.face")

MAX_SUBJECT = 512  # characters of a subject; NATS subjects of real tools are far shorter
MAX_DEFINITION = 256 * 1024  # bytes of one tool's definition (schemas included)
MAX_TOOLS = 10_000  # tools kept from all nodes together; past it the rest are left out (and said)
DEFAULT_SCHEMA: dict[str, Any] = {"type": "object"}


class FaceError(Exception):
    """A face setting that cannot work (a profile, a config file); said once, at start."""


@dataclass(frozen=True)
class FaceTool:
    """One tool as a client sees it, and where on the bus it is called."""

    name: str
    subject: str
    kind: str  # tool | seat
    module: str
    nodes: tuple[str, ...]
    states: tuple[str, ...]  # the bundle's state on each node, in the order of `nodes`
    definition: dict[str, Any]  # the MCP Tool as the client gets it (its name replaced by `name`)


@dataclass
class Selection:
    """Which tools a client sees: `only` (none: all) minus `exclude`, at most `max_tools`.

    A pattern (shell style: `memory_*`, `mesh.seat.*`) matches a tool's name or its subject.
    """

    only: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    max_tools: int | None = None

    def wants(self, tool: FaceTool) -> bool:
        def hit(patterns: list[str]) -> bool:
            return any(fnmatch.fnmatchcase(tool.name, p) or fnmatch.fnmatchcase(tool.subject, p) for p in patterns)

        return (not self.only or hit(self.only)) and not hit(self.exclude)


class _Profile(msgspec.Struct, forbid_unknown_fields=True, rename={"exclude": "except"}):
    only: list[str] = []
    exclude: list[str] = []
    max_tools: int | None = None


class _FaceFile(msgspec.Struct, forbid_unknown_fields=True):
    profiles: dict[str, _Profile] = {}
    auth: dict[str, Any] = {}  # read by auth.py (load_http_settings)
    http: dict[str, Any] = {}


def load_selection(
    path: Path | None, profile: str | None, only: list[str], exclude: list[str], max_tools: int | None
) -> Selection:
    """The profile named in the config file, with the command line's patterns added to it."""
    chosen = _Profile()
    if profile is not None:
        if path is None:
            raise FaceError(f"profile {profile!r} needs a config file: name it with --config FILE")
        try:
            data = tomllib.loads(path.read_text())
            profiles = msgspec.convert(data, _FaceFile).profiles
        except OSError as e:
            raise FaceError(f"{path}: cannot read it ({e.strerror})") from None
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
            raise FaceError(
                f"{path}: {e}; write [profiles.<name>] tables with only = [...], except = [...], max_tools = N"
            ) from None
        if profile not in profiles:
            raise FaceError(f"{path} has no profile {profile!r}; it has: {', '.join(sorted(profiles)) or 'none'}")
        chosen = profiles[profile]
    cap = max_tools if max_tools is not None else chosen.max_tools
    if cap is not None and cap < 1:
        raise FaceError(f"max_tools is {cap}; give a whole number of at least 1")
    return Selection(only=chosen.only + only, exclude=chosen.exclude + exclude, max_tools=cap)


@dataclass
class _Seen:
    kind: str
    module: str
    nodes: list[tuple[str, str, dict[str, Any]]]  # (node, state, definition)


def _endpoint(endpoint: Any) -> tuple[str, str, str, str, dict[str, Any]] | str:
    """(subject, kind, module, state, definition) of one endpoint, or why it is left out."""
    if not isinstance(endpoint, dict):
        return "an endpoint that is not an object"
    subject, meta = endpoint.get("subject"), endpoint.get("metadata")
    if not isinstance(subject, str) or not isinstance(meta, dict) or len(subject) > MAX_SUBJECT:
        return "an endpoint without a subject or metadata"
    if not subject.startswith((TOOL_PREFIX, SEAT_PREFIX)) or any(c in subject for c in " *>\t\r\n"):
        return f"{subject[:80]!r}: not a mesh.tool.* or mesh.seat.* subject"
    text = meta.get("mcp_tool")
    if not isinstance(text, str) or len(text) > MAX_DEFINITION:
        return f"{subject}: no tool definition of at most {MAX_DEFINITION} bytes (a node older than the face?)"
    try:
        definition = json.loads(text)
    except ValueError:
        return f"{subject}: the tool definition is not JSON"
    if not isinstance(definition, dict) or definition.get("name") != meta.get("tool"):
        return f"{subject}: the tool definition is not an object named as the endpoint's tool"
    kind = "seat" if subject.startswith(SEAT_PREFIX) else "tool"
    module, state = meta.get("module"), meta.get("state")
    return (
        subject,
        kind,
        str(module) if isinstance(module, str) else "",
        str(state) if isinstance(state, str) else "",
        definition,
    )


def _client_definition(name: str, definition: dict[str, Any]) -> dict[str, Any]:
    """The definition as MCP clients expect it: description and schemas as the tool wrote them."""
    shown: dict[str, Any] = {"name": name}
    for key in ("title", "description", "inputSchema", "outputSchema", "annotations", "icons", "execution"):
        value = definition.get(key)
        if value is not None and value != "":
            shown[key] = value
    if not isinstance(shown.get("inputSchema"), dict) or not shown["inputSchema"]:
        shown["inputSchema"] = DEFAULT_SCHEMA
    return shown


class Catalog:
    """The current list, rebuilt from INFO answers; `notes` are said once each, then remembered."""

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.tools: list[FaceTool] = []  # what a client sees, sorted by name
        self.by_name: dict[str, FaceTool] = {}
        self.left_out: list[FaceTool] = []  # chosen away by the selection (for --list)
        self._said: set[str] = set()
        self._said_cap = 4096  # notes remembered; past it they may be said again

    def rebuild(self, infos: list[Any], gone: set[str] | frozenset[str] = frozenset()) -> bool:
        """Take a new set of INFO answers; True when what a client sees changed."""
        seen: dict[str, _Seen] = {}
        notes: list[str] = []
        for info in infos:
            if not isinstance(info, dict) or info.get("id") in gone:
                continue
            meta = info.get("metadata") if isinstance(info.get("metadata"), dict) else {}
            node = str((meta or {}).get("node") or info.get("id") or "?")[:256]
            endpoints = info.get("endpoints")
            for endpoint in endpoints if isinstance(endpoints, list) else []:
                got = _endpoint(endpoint)
                if isinstance(got, str):
                    notes.append(f"node {node}: left out {got}")
                    continue
                subject, kind, module, state, definition = got
                if subject not in seen and len(seen) >= MAX_TOOLS:
                    notes.append(f"more than {MAX_TOOLS} tools on the bus: {subject} and later ones left out")
                    continue
                seen.setdefault(subject, _Seen(kind, module, [])).nodes.append((node, state, definition))
        names, name_notes = assign_names(list(seen))
        all_tools = []
        for subject, s in seen.items():
            s.nodes.sort(key=lambda n: n[0])
            name = names[subject]
            all_tools.append(
                FaceTool(
                    name=name,
                    subject=subject,
                    kind=s.kind,
                    module=s.module,
                    nodes=tuple(n[0] for n in s.nodes),
                    states=tuple(n[1] for n in s.nodes),
                    definition=_client_definition(name, s.nodes[0][2]),
                )
            )
        all_tools.sort(key=lambda t: t.name)
        shown = [t for t in all_tools if self.selection.wants(t)]
        cap = self.selection.max_tools
        if cap is not None and len(shown) > cap:
            notes.append(f"{len(shown)} tools chosen, {cap} shown (max_tools): {shown[cap].name} and later left out")
            shown = shown[:cap]
        shown_names = {t.name for t in shown}
        self.left_out = [t for t in all_tools if t.name not in shown_names]
        self._say(notes + name_notes)
        changed = shown != self.tools  # names, definitions, nodes and their bundles' states
        self.tools = shown
        self.by_name = {t.name: t for t in shown}
        return changed

    def _say(self, notes: list[str]) -> None:
        for note in notes:
            if note not in self._said:
                if len(self._said) >= self._said_cap:
                    self._said.clear()
                self._said.add(note)
                log.warning("%s", note)
