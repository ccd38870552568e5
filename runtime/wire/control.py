"""A node's control subjects, typed: `mesh.node.<node>.status | restart | seat-move` (mesh account only).

The node answers them (runtime/node/control.py); meshctl, smoke and the tests ask them. Each reply
is a msgspec struct, read back as one: a missing field is an error at the edge, not a default.
"""

from __future__ import annotations

import msgspec

from launcher.status import BundleStatus

__all__ = [
    "BundleStatus",
    "ModuleStatus",
    "NodeStatus",
    "RestartAsk",
    "RestartReply",
    "SeatMoveAsk",
    "SeatMoveReply",
    "SeatStatus",
]


class ModuleStatus(msgspec.Struct):
    name: str
    version: str
    source: str


class SeatStatus(msgspec.Struct):
    seat: str
    module: str
    state: str  # held | elsewhere (another node holds it) | refused | starting
    reason: str = ""
    holder: str = ""  # the node that holds it, when another one does
    home: str = ""  # the node whose disk holds its data, when that is not this one


class NodeStatus(msgspec.Struct):
    node: str
    url: str
    pid: int
    uptime_s: float
    modules: list[ModuleStatus]
    bundles: list[BundleStatus]
    seats: list[SeatStatus]
    problems: list[str]
    in_flight: int
    answered: int
    cluster: str = ""  # the NATS cluster of the server the node is connected to ("" for a lone server)
    server: str = ""  # that server's name

    def bundle(self, key: str) -> BundleStatus | None:
        """The bundle `module/bundle`, if this node runs it."""
        return next((b for b in self.bundles if f"{b.module}/{b.bundle}" == key), None)


class RestartAsk(msgspec.Struct):
    bundle: str = ""  # module/bundle, or the module when it has one bundle


class RestartReply(msgspec.Struct, omit_defaults=True):
    ok: bool
    bundle: str = ""
    was: str = ""  # the bundle's state when the restart was asked
    error: str = ""


class SeatMoveAsk(msgspec.Struct):
    seat: str = ""
    to: str = ""


class SeatMoveReply(msgspec.Struct, omit_defaults=True):
    ok: bool
    seat: str = ""
    from_node: str = msgspec.field(default="", name="from")
    to: str = ""
    object: str = ""  # where the packed data waits in the seat data bucket
    error: str = ""
