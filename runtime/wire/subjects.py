"""Every subject and bucket of the mesh, spelled once: the node, meshctl, the face and callers use these.

docs/bus.md is the spec. Pure: no I/O.
"""

from __future__ import annotations

# --- calls ------------------------------------------------------------------------------------
TOOL_PREFIX = "mesh.tool."  # mesh.tool.<module>.<tool>: a module's own tool
SEAT_PREFIX = "mesh.seat."  # mesh.seat.<seat>.<verb>: a held seat's verb
CANCEL_PREFIX = "mesh.cancel."  # mesh.cancel.<call id>: its caller cancels a call
FETCH_PREFIX = "mesh.fetch."  # mesh.fetch.<object>: a result object read back through any node

# --- what the nodes tell watchers -------------------------------------------------------------
CHANGES_SUBJECT = "mesh.events.tools"  # one message per burst of changes of what a node serves
CATALOG_PREFIX = "mesh.catalog."  # mesh.catalog.<key>: every write to the catalogue, republished by the server

# --- the Service API --------------------------------------------------------------------------
SERVICE_NAME = "mesh-node"
SERVICE_VERSION = "0.1.0"
SERVICE_VERBS = ("PING", "INFO", "STATS")

# --- a node's control subjects (mesh account only) --------------------------------------------
NODE_PREFIX = "mesh.node."
STATUS = "status"
RESTART = "restart"
SEAT_MOVE = "seat-move"
CALLERS = "callers"  # the embedded bus's callers (meshctl caller add/remove/list)
CONTROL_VERBS = (STATUS, RESTART, SEAT_MOVE, CALLERS)

# --- JetStream buckets ------------------------------------------------------------------------
MEMBERSHIP_BUCKET = "mesh-membership"  # KV: a node's modules and seats (delivery)
BUNDLES_BUCKET = "mesh-bundles"  # object store: delivered artifacts
LEASE_BUCKET = "mesh-seat-leases"  # KV: who holds a stateful seat
HOME_BUCKET = "mesh-seat-homes"  # KV: where a disk-backed seat's data lives
SEAT_DATA_BUCKET = "mesh-seat-data"  # object store: a seat's data on its way to a new home
CALLS_BUCKET = "mesh-calls"  # object store: requests and results larger than a message
CATALOG_BUCKET = "mesh-catalog"  # KV: what every node serves, its tools' definitions (runtime/wire/catalog.py)


def tool_subject(module: str, tool: str) -> str:
    return f"{TOOL_PREFIX}{module}.{tool}"


def seat_subject(seat: str, verb: str) -> str:
    return f"{SEAT_PREFIX}{seat}.{verb}"


def module_subjects(module: str) -> str:
    """The one subscription of a module's own tools."""
    return f"{TOOL_PREFIX}{module}.>"


def seat_subjects(seat: str) -> str:
    """The one subscription of a held seat's verbs."""
    return f"{SEAT_PREFIX}{seat}.>"


def split_seat_tool(name: str) -> tuple[str, str] | None:
    """A tool named `<seat>.<verb>` implements that seat's verb: (seat, verb), else None."""
    seat, dot, verb = name.partition(".")
    if dot and seat and verb and "." not in verb:
        return seat, verb
    return None


def cancel_subject(call_id: str) -> str:
    return CANCEL_PREFIX + call_id


def fetch_subject(name: str) -> str:
    return FETCH_PREFIX + name


def node_subject(node: str, verb: str) -> str:
    """`mesh.node.<node>.<verb>`: status, restart and seat-move of one node (runtime/wire/control.py)."""
    return f"{NODE_PREFIX}{node}.{verb}"


def service_subjects(verb: str, service_id: str) -> tuple[str, str, str]:
    """The three subjects a Service API verb is asked on: for all services, this name, this instance."""
    return f"$SRV.{verb}", f"$SRV.{verb}.{SERVICE_NAME}", f"$SRV.{verb}.{SERVICE_NAME}.{service_id}"


def service_subject(verb: str, service_id: str | None = None) -> str:
    """One Service API verb of every node (`$SRV.INFO.mesh-node`), or of one (`...<id>`)."""
    return f"$SRV.{verb}.{SERVICE_NAME}" + (f".{service_id}" if service_id else "")
