"""Subjects to bundles: which tool of which bundle answers a subject, and why not when none.

`mesh.tool.<module>.<tool>` reaches a module's own tool; `mesh.seat.<seat>.<verb>` reaches
the verb of a seat held on this node. A seat verb is served only on its seat subject, never
under the module's subject: a stateful seat answered by a node that does not hold it would
write into a second, unconnected store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import msgspec

from launcher.bundle import STARTING_STATES, BundleRunner
from launcher.errors import BundleUnavailable
from launcher.session import Tool
from runtime.bus.service_api import EndpointStats
from runtime.calls.schema import compile_schema
from runtime.wire.errors import NodeError, NoSuchTool, Unavailable
from runtime.wire.subjects import SEAT_PREFIX, TOOL_PREFIX, seat_subject, split_seat_tool, tool_subject

_encode = msgspec.json.encode
log = logging.getLogger("mesh.routes")


class Route:
    """One subject served by one tool of one bundle: a Service API endpoint, with its stats."""

    __slots__ = (
        "subject",
        "kind",
        "module",
        "tool",
        "tool_json",
        "definition_json",
        "bundle",
        "checker",
        "stats",
    )

    def __init__(self, subject: str, kind: str, module: str, tool: Tool, bundle: BundleRunner) -> None:
        self.subject, self.kind, self.module, self.bundle = subject, kind, module, bundle
        self.tool = tool.name
        self.tool_json = _encode(tool.name)
        # The tool's MCP definition, for the Service API's endpoint metadata (the MCP face lists it).
        self.definition_json = _encode(tool).decode()
        self.checker = compile_schema(tool.inputSchema)
        self.stats = EndpointStats()

    def endpoint_name(self) -> str:
        # Service API endpoint names allow letters, digits, - and _ only.
        raw = f"{self.kind}-{self.module}-{self.tool}" if self.kind == "tool" else f"seat-{self.tool}"
        return "".join(c if c.isalnum() or c in "-_" else "_" for c in raw)

    def metadata(self) -> dict[str, str]:
        # Service API metadata is string to string: the definition travels as JSON text.
        return {
            "kind": self.kind,
            "module": self.module,
            "tool": self.tool,
            "bundle": self.bundle.key,
            "state": self.bundle.state,
            "mcp_tool": self.definition_json,
        }


@dataclass
class ModuleEntry:
    name: str
    version: str
    bundles: list[BundleRunner]
    seats: list[str] = field(default_factory=list)  # seats this module holds on this node
    # The seats its module.toml declares ([[seat]]); None: not known, nothing is checked.
    declared_seats: list[str] | None = None
    stateful: set[str] = field(default_factory=set)  # its seats held through a lease (runtime/seats/keeper.py)
    wanted_seats: list[str] = field(default_factory=list)  # the seats it claims on this node (held or not)

    def serves_own_tools(self) -> bool:
        # Its own tools share the store of its stateful seats: served only where it holds them all.
        return self.stateful <= set(self.seats)


class RouteTable:
    def __init__(self, node: str) -> None:
        self.node = node
        self.modules: dict[str, ModuleEntry] = {}
        self.seat_holders: dict[str, str] = {}  # seat -> module
        self.routes: dict[str, Route] = {}
        # (module, tool) -> the load-time error of a `<seat>.<verb>` tool whose seat is not declared.
        self._undeclared: dict[tuple[str, str], str] = {}
        # The seats' word on a call to a module holding a stateful seat (runtime/seats/seats.py): a
        # lease not renewed in time (a node paused past it) refuses the call, never writes a store
        # another node may hold by now.
        self.fence: Callable[[str, str], NodeError | None] | None = None
        # Whether a tools runner was started: a stateful module's runners wait, unstarted, until its
        # seats are held here (runtime/node/modules.py); until then they are nothing to wait for.
        self.started: Callable[[BundleRunner], bool] = lambda bundle: True

    def problems(self) -> list[str]:
        """The tools that cannot be served as they are named, each said once in an ERROR line."""
        return list(self._undeclared.values())

    def _undeclared_seat(self, entry: ModuleEntry, bundle: BundleRunner, tool: str, seat: str) -> str:
        problem = (
            f"module {entry.name}, bundle {bundle.key}: tool {tool!r} is a verb of seat {seat!r}, which the "
            f'module does not declare; it is not served. Add [[seat]] name = "{seat}" to its module.toml, '
            f"or rename the tool without a dot"
        )
        if self._undeclared.get((entry.name, tool)) != problem:
            log.error("%s", problem)  # once, not on every rebuild
        return problem

    def rebuild(self) -> None:
        """Recompute every route from the bundles' current tool lists; stats carry over."""
        old = self.routes
        routes: dict[str, Route] = {}
        undeclared: dict[tuple[str, str], str] = {}
        for entry in self.modules.values():
            held = set(entry.seats)
            own = entry.serves_own_tools()
            for bundle in entry.bundles:
                for tool in bundle.tools.values():
                    seat_verb = split_seat_tool(tool.name)
                    if seat_verb is None:
                        if not own:
                            continue  # its stateful seat is held elsewhere: so is its store
                        subject, kind = tool_subject(entry.name, tool.name), "tool"
                    elif seat_verb[0] in held:
                        subject, kind = seat_subject(*seat_verb), "seat"
                    else:
                        if entry.declared_seats is not None and seat_verb[0] not in entry.declared_seats:
                            undeclared[(entry.name, tool.name)] = self._undeclared_seat(
                                entry, bundle, tool.name, seat_verb[0]
                            )
                        continue  # a verb of a seat this module does not hold here
                    route = Route(subject, kind, entry.name, tool, bundle)
                    previous = old.get(subject)
                    if previous is not None:
                        route.stats = previous.stats
                    routes.setdefault(subject, route)
        self.routes = routes
        self._undeclared = undeclared

    def resolve(self, subject: str) -> Route:
        route = self.routes.get(subject)
        if route is not None:
            refused = self.fence(subject, route.module) if self.fence is not None else None
            if refused is not None:
                raise refused
            return route
        raise self.why_not(subject)

    def starting(self, subject: str) -> list[BundleRunner]:
        """Bundles still starting that might serve this subject once they list their tools."""
        module = None
        if subject.startswith(TOOL_PREFIX):
            module = subject[len(TOOL_PREFIX) :].partition(".")[0]
        elif subject.startswith(SEAT_PREFIX):
            module = self.seat_holders.get(subject[len(SEAT_PREFIX) :].partition(".")[0])
        entry = self.modules.get(module) if module else None
        return [b for b in entry.bundles if b.state in STARTING_STATES and self.started(b)] if entry else []

    def why_not(self, subject: str, down: BundleUnavailable | None = None) -> Exception:
        """404 when nothing here could serve it; 503 when the bundle that might is down (`down`: why,
        when the caller knows better than the bundle's state, e.g. the start it waited for failed)."""
        if subject.startswith(TOOL_PREFIX):
            module, _, tool = subject[len(TOOL_PREFIX) :].partition(".")
            entry = self.modules.get(module)
            if entry is None:
                return NoSuchTool(subject, f"module {module!r} is not served by node {self.node}", sorted(self.modules))
            what, family = f"module {module} has no tool {tool!r}", module
        elif subject.startswith(SEAT_PREFIX):
            seat, _, verb = subject[len(SEAT_PREFIX) :].partition(".")
            holder = self.seat_holders.get(seat)
            if holder is None:
                return NoSuchTool(subject, f"seat {seat!r} is not held on node {self.node}", sorted(self.seat_holders))
            entry = self.modules[holder]
            what, family, tool = f"seat {seat} has no verb {verb!r} (held by module {holder})", holder, f"{seat}.{verb}"
        else:
            return NoSuchTool(subject, "not a mesh subject (mesh.tool.<module>.<tool> or mesh.seat.<seat>.<verb>)", [])
        if down is not None:
            return Unavailable(tool, family, down, self.node)
        for bundle in entry.bundles:
            if bundle.state != "ready" and self.started(bundle):
                return Unavailable(tool, family, bundle.unavailable(), self.node)
        known = sorted(r.subject for r in self.routes.values() if r.module == entry.name)
        problem = self._undeclared.get((entry.name, tool))
        if problem is not None:
            return NoSuchTool(subject, f"{what}: {problem}", known, ways_out=[problem.split("served. ", 1)[1]])
        return NoSuchTool(subject, what, known)
