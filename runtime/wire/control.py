"""A node's control subjects, typed: `mesh.node.<node>.status | restart | seat-move | callers` (mesh account only).

The node answers them (runtime/node/control.py); meshctl, smoke and the tests ask them. Each reply
is a msgspec struct, read back as one: a missing field is an error at the edge, not a default.
"""

from __future__ import annotations

import msgspec

from launcher.status import BundleStatus

__all__ = [
    "BundleStatus",
    "CallerRow",
    "CallersAsk",
    "CallersReply",
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
    store: str = ""  # the store id it is served from (held), or the one it expects (refused)
    # A replicated seat held here: when its replica last took a write, and how far the database was
    # ahead of it then (seconds), as of the holder's last lease renewal.
    synced: float = 0.0
    lag_s: float = 0.0


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
    # Whose word the caller a tool sees is (runtime/bus/trust.py): "server-stamped: ..." or
    # "unverified: ... every caller is local".
    identity: str = ""
    cluster: str = ""  # the NATS cluster of the server the node is connected to ("" for a lone server)
    server: str = ""  # that server's name
    # What the node's children are confined with (runtime/hosting/confine.py `node_sandbox`):
    # "landlock v7 + seccomp", or what is missing and whether [sandbox] required refuses them.
    sandbox: str = ""

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


class CallerRow(msgspec.Struct, frozen=True):
    """One user of the embedded bus as `meshctl caller list` shows it."""

    account: str
    user: str
    kind: str  # operator | face | console | config | added
    via: str  # what the node marks its calls: bus, local, mcp or console
    password_file: str  # "" when its password is in the node's config


class CallersAsk(msgspec.Struct):
    """`meshctl caller add/remove/list`: the embedded bus's callers, changed by the node that runs it."""

    op: str = "list"  # list | add | remove
    user: str = ""
    account: str = ""  # add: the caller's account; "" the same as the user
    via: str = ""  # add: "mcp" or "console" for a delegate; "" an ordinary caller


class CallersReply(msgspec.Struct, omit_defaults=True):
    ok: bool
    callers: list[CallerRow] = []
    changed: CallerRow | None = None  # the caller added or removed
    error: str = ""
