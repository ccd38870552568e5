"""Errors of the runtime itself (not of a tool), as the bus renders them.

Each is a type with its facts in fields; `render()` turns one into the Service API error
headers and a JSON body, once, at the edge.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import msgspec

HEADER_CODE = "Nats-Service-Error-Code"
HEADER_TEXT = "Nats-Service-Error"


# The facts a 503 or 504 names, as the launcher's errors carry them (launcher/errors.py): the wire
# reads them by shape, so that callers and the face need nothing of the launcher.
class DownFacts(Protocol):
    @property
    def bundle(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def last_exit(self) -> str | None: ...
    @property
    def stderr_tail(self) -> Sequence[str]: ...
    @property
    def reason(self) -> str: ...


class BusyFacts(Protocol):
    @property
    def bundle(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def waiting(self) -> int: ...


class LateFacts(Protocol):
    @property
    def bundle(self) -> str: ...
    @property
    def timeout_ms(self) -> int: ...
    @property
    def waited_for(self) -> str:
        """ "start", "slot" or "child": where the one deadline of the call went."""
        ...


class NodeError(Exception):
    code: int = 500
    kind: str = "internal"

    def facts(self) -> dict[str, Any]:
        return {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "kind": self.kind, "message": str(self), **self.facts()}}


class BadRequest(NodeError):
    code, kind = 400, "bad_request"

    def __init__(self, subject: str, problem: str, field: str | None = None) -> None:
        self.subject, self.problem, self.field = subject, problem, field
        super().__init__(f"{subject}: {problem}")

    def facts(self) -> dict[str, Any]:
        return {"subject": self.subject, "field": self.field} if self.field else {"subject": self.subject}


class NoSuchTool(NodeError):
    code, kind = 404, "not_found"

    def __init__(self, subject: str, what: str, known: list[str], ways_out: list[str] | None = None) -> None:
        self.subject, self.what, self.known, self.ways_out = subject, what, known, ways_out
        listing = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
        super().__init__(f"{what}; served here: {listing or 'none'}")

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"subject": self.subject, "known": self.known}
        if self.ways_out:
            facts["ways_out"] = self.ways_out
        return facts


class TooLarge(NodeError):
    code, kind = 413, "too_large"

    def __init__(self, subject: str, what: str, size: int, limit: int) -> None:
        self.subject, self.what, self.size, self.limit = subject, what, size, limit
        super().__init__(f"{what} is {size} bytes; the bus carries at most {limit} bytes")

    def facts(self) -> dict[str, Any]:
        return {"subject": self.subject, "size": self.size, "limit": self.limit}


class NoSuchObject(NodeError):
    """A result object asked for through a node that is not there for the asker (or at all)."""

    code, kind = 404, "not_found"

    def __init__(self, subject: str, name: str, bucket: str, ttl_s: float) -> None:
        self.subject, self.name = subject, name
        super().__init__(
            f"no result object {name[:80]!r} for your account in {bucket}: it expired (TTL {ttl_s:g} s), "
            "or its name is not one a reply gave you"
        )

    def facts(self) -> dict[str, Any]:
        return {"subject": self.subject}


class OverCap(NodeError):
    """A result or request too large even for the object store handoff (or with no store to use)."""

    code, kind = 413, "too_large"

    def __init__(self, subject: str, what: str, size: int, cap: int, why: str) -> None:
        self.subject, self.what, self.size, self.cap = subject, what, size, cap
        super().__init__(f"{what} is {size} bytes; {why}")

    def facts(self) -> dict[str, Any]:
        return {"subject": self.subject, "size": self.size, "cap": self.cap}


_STATE_WORDS = {"backoff": "waiting to restart (backoff)", "building": "being built"}


def _bundle_facts(tool: str, module: str, bundle: str, node: str) -> dict[str, Any]:
    return {"tool": tool, "module": module, "bundle": bundle, "node": node}


class Unavailable(NodeError):
    code, kind = 503, "bundle_unavailable"

    def __init__(self, tool: str, module: str, cause: DownFacts, node: str) -> None:
        self.tool, self.module, self.cause, self.node = tool, module, cause, node
        state = _STATE_WORDS.get(cause.state, cause.state)
        what = f"tool family {module} ({tool}) is unavailable: bundle {cause.bundle} is {state}"
        if cause.last_exit:
            what += f", last exit: {cause.last_exit}"
        if cause.reason:
            what += f" ({cause.reason})"
        super().__init__(what)

    def facts(self) -> dict[str, Any]:
        c = self.cause
        return {
            **_bundle_facts(self.tool, self.module, c.bundle, self.node),
            "state": c.state,
            "last_exit": c.last_exit,
            "reason": c.reason,
            "stderr_tail": list(c.stderr_tail[-10:]),
            "ways_out": [
                f"see `meshctl node status --name {self.node}` and the node's log for bundle {c.bundle}",
                f"fix the bundle and run `meshctl node restart {c.bundle} --name {self.node}`"
                if c.state == "failed"
                else "retry: the node restarts the bundle on its own",
                "deliver a working version of the module to this node",
            ],
        }


class Overloaded(NodeError):
    code, kind = 503, "overloaded"

    def __init__(self, tool: str, module: str, cause: BusyFacts, node: str) -> None:
        self.tool, self.module, self.cause, self.node = tool, module, cause, node
        super().__init__(
            f"tool family {module} ({tool}) is overloaded on node {node}: bundle {cause.bundle} has "
            f"{cause.in_flight} in flight of {cause.limit} (max_in_flight) and {cause.waiting} calls waiting "
            "for a slot already; retry later or on another node"
        )

    def facts(self) -> dict[str, Any]:
        c = self.cause
        return {
            **_bundle_facts(self.tool, self.module, c.bundle, self.node),
            "in_flight": c.in_flight,
            "limit": c.limit,
            "waiting": c.waiting,
            "ways_out": [
                "retry after a pause: the calls in flight end within their timeout",
                f"raise max_in_flight of bundle {c.bundle} in its module.toml if the child can take more",
                "serve the module on more nodes: the queue group shares the calls",
            ],
        }


class IntakeFull(NodeError):
    """A request read while the node's queue of its subject's requests was full: refused at once."""

    code, kind = 503, "overloaded"

    def __init__(self, subject: str, node: str, max_msgs: int, max_bytes: int) -> None:
        self.subject, self.node, self.max_msgs, self.max_bytes = subject, node, max_msgs, max_bytes
        super().__init__(
            f"{subject}: node {node} is overloaded: requests come faster than it takes them and "
            f"{max_msgs} requests or {max_bytes} bytes wait already; retry later or on another node"
        )

    def facts(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "node": self.node,
            "ways_out": [
                "retry after a pause",
                "serve the module on more nodes: the queue group shares the calls",
            ],
        }


_WHERE_THE_TIME_WENT = {
    "start": "all of it went waiting for bundle {b} to start; the call never reached the child",
    "slot": "it waited for a free slot of bundle {b} (max_in_flight) and never reached the child",
}


class TimedOut(NodeError):
    code, kind = 504, "timed_out"

    def __init__(self, tool: str, cause: LateFacts, deadline: str = "bundle") -> None:
        # deadline: whose ran out, "bundle" (the manifest's timeout_ms) or "caller" (Mesh-Timeout-Ms)
        self.tool, self.cause, self.deadline = tool, cause, deadline
        whose = "the caller's deadline (Mesh-Timeout-Ms)" if deadline == "caller" else "the bundle's timeout_ms"
        where = _WHERE_THE_TIME_WENT.get(cause.waited_for, "the call was cancelled in bundle {b}")
        super().__init__(f"{tool} did not answer within {cause.timeout_ms} ms, {whose}; {where.format(b=cause.bundle)}")

    def facts(self) -> dict[str, Any]:
        c = self.cause
        return {
            "tool": self.tool,
            "bundle": c.bundle,
            "timeout_ms": c.timeout_ms,
            "deadline": self.deadline,
            "waited_for": c.waited_for,
        }


class Internal(NodeError):
    code, kind = 500, "internal"


_encode = msgspec.json.Encoder().encode


def render(error: NodeError) -> tuple[bytes, dict[str, str]]:
    """The reply body and Service API headers for a runtime error."""
    text = str(error).replace("\r", " ").replace("\n", " ")
    return _encode(error.body()), {HEADER_CODE: str(error.code), HEADER_TEXT: text[:1024]}


class NodeStopping(NodeError):
    code, kind = 503, "node_stopping"

    def __init__(self, subject: str, node: str) -> None:
        self.subject, self.node = subject, node
        super().__init__(f"{subject}: node {node} stopped before the call finished; it was cancelled in the bundle")


class SeatUnavailable(NodeError):
    """A stateful seat (or its module's own tool) asked of a node that must not serve it."""

    code, kind = 503, "seat_unavailable"

    def __init__(
        self,
        subject: str,
        seat: str,
        module: str,
        node: str,
        holder: str,
        why: str,
        ways_out: list[str],
        store: dict[str, Any] | None = None,
    ) -> None:
        self.subject, self.seat, self.module, self.node = subject, seat, module, node
        self.holder, self.why, self.ways_out = holder, why, ways_out
        self.store = store  # the store expected (id, node, since), the path looked in, what was found
        super().__init__(f"seat {seat} is unavailable: {why}; node {node} does not serve it from an empty store")

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "subject": self.subject,
            "seat": self.seat,
            "module": self.module,
            "node": self.node,
            "holder": self.holder,
            "ways_out": self.ways_out,
        }
        if self.store is not None:
            facts["store"] = self.store
        return facts
