"""What a tool handler learns about its own call: who called, whether it was cancelled, progress.

All three read the call's `Context` (a handler gets it by declaring a parameter annotated
`Context`). Nothing here runs unless a handler asks, so a call that does not use them costs
nothing more than before.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mcp.server.mcpserver import Context

# The key the node sets on every tools/call's params._meta (the mesh's shared contract).
CALLER_META_KEY = "mesh/caller"
VIAS = ("bus", "local", "mcp", "console")
DELEGATE_VIAS = ("mcp", "console")  # the channels whose caller may name a person
# Longest account, user or name accepted, in UTF-8 bytes (as every SDK of the mesh).
MAX_CALLER_FIELD_BYTES = 256
# C0 controls and DEL: a caller field is a name, never a line break or an escape sequence.
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f]")

_log = logging.getLogger("mesh_sdk")


def _escape(text: str) -> str:
    """A name as it stands in an id: `%`, `/` and `:` percent-encoded (the mesh's shared rule)."""
    return text.replace("%", "%25").replace("/", "%2F").replace(":", "%3A")


@dataclass(frozen=True, slots=True)
class Person:
    """The human behind a delegate's call (an MCP face, a console), as the delegate named them."""

    iss: str  # who vouched for them: an OAuth issuer, or `unix:<host>` for an OS user
    sub: str  # their subject at that issuer
    name: str  # shown to people

    @property
    def id(self) -> str:
        return f"person:{_escape(self.iss)}/{_escape(self.sub)}"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made this call, as the node stamped it (never taken from the call's arguments)."""

    account: str  # the NATS account the request came from (server-stamped)
    user: str | None  # the user inside that account, when the account shares it
    name: str | None  # the client connection's name, when it gave one
    via: Literal["bus", "local", "mcp", "console"]  # the channel: the bus, the node's own, a face, a console
    person: Person | None = None  # the person behind a delegate's call (via mcp or console)

    @property
    def id(self) -> str:
        """The stable key for whoever acts on this call (author, owner): the person's when a delegate
        named one ("person:<iss>/<sub>"), else "<account>/<user>" ("<account>" without a user),
        "local:" before it for the node's own caller; names escaped so no two callers share an id."""
        if self.person is not None:
            return self.person.id
        base = _escape(self.account) if self.user is None else f"{_escape(self.account)}/{_escape(self.user)}"
        return f"local:{base}" if self.via == "local" else base


def _field_problem(field: str, value: Any) -> str | None:
    """Why `value` is not a caller field, or None when it is one."""
    if not isinstance(value, str):
        return f"{field} is {type(value).__name__}, not a string"
    if not value:
        return f"{field} is empty"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{field} is not valid text (a lone UTF-16 surrogate)"
    if size > MAX_CALLER_FIELD_BYTES:
        return f"{field} is longer than {MAX_CALLER_FIELD_BYTES} bytes"
    if _NOT_TEXT.search(value):
        return f"{field} holds control characters"
    return None


def _person_problem(raw: Any, via: Any) -> str | None:
    if raw is None:
        return None
    if via not in DELEGATE_VIAS:
        return f"a person comes only with via {' or '.join(DELEGATE_VIAS)}"
    if not isinstance(raw, Mapping):
        return "person is not an object"
    for field in ("iss", "sub", "name"):
        if problem := _field_problem(f"person.{field}", raw.get(field)):
            return problem
    return None


def _caller_problem(raw: Any) -> str | None:
    if not isinstance(raw, Mapping):
        return "it is not an object"
    user, name = raw.get("user"), raw.get("name")
    return (
        _field_problem("account", raw.get("account"))
        or (None if user is None else _field_problem("user", user))
        or (None if name is None else _field_problem("name", name))
        or (None if raw.get("via") in VIAS else f"via is not one of {', '.join(VIAS)}")
        or _person_problem(raw.get("person"), raw.get("via"))
    )


def parse_caller(raw: Any) -> Caller | None:
    """The caller from a `_meta["mesh/caller"]` value; None when absent or malformed.

    Malformed never raises: a handler asked who is calling gets "nobody I can vouch for"
    rather than a crash, and the reason is logged (one WARNING line) for whoever debugs the node.
    """
    if raw is None:
        return None
    problem = _caller_problem(raw)
    if problem is not None:
        _log.warning("%s is malformed: %s; the handler gets no caller", CALLER_META_KEY, problem)
        return None
    person = raw.get("person")
    return Caller(
        account=raw["account"],
        user=raw.get("user"),
        name=raw.get("name"),
        via=raw["via"],
        person=None if person is None else Person(iss=person["iss"], sub=person["sub"], name=person["name"]),
    )


def _meta(ctx: Context[Any, Any]) -> Mapping[str, Any]:
    try:
        meta = ctx.request_context.meta
    except ValueError:  # a Context outside a request (e.g. a tool called directly in a test)
        return {}
    return meta if isinstance(meta, Mapping) else {}


def caller(ctx: Context[Any, Any]) -> Caller | None:
    """The caller of this tool call, or None when the call carries none (e.g. run by hand)."""
    return parse_caller(_meta(ctx).get(CALLER_META_KEY))


async def progress(
    ctx: Context[Any, Any], progress: float, total: float | None = None, message: str | None = None
) -> None:
    """Send `notifications/progress` for this call; a no-op when the caller asked for none.

    From a plain `def` tool (a worker thread) call it as
    `anyio.from_thread.run(progress, ctx, done, total)`.
    """
    # The library holds the call's token and sends nothing when there is none.
    await ctx.report_progress(progress, total, message)


def cancelled() -> bool:
    """True once this call was cancelled (`notifications/cancelled`); for loops that poll.

    An `async def` tool is also cancelled at its next `await`; a plain `def` tool runs in a
    worker thread that nothing can interrupt, so it polls this and stops early. The result
    is dropped either way: no reply is sent for a cancelled call.
    """
    import anyio  # lazy: only tools that poll pay for it
    import anyio.from_thread

    try:
        anyio.from_thread.check_cancelled()
        return False
    except RuntimeError:  # NoEventLoopError: not in a worker thread but on the loop, an async tool
        pass
    except BaseException:  # the backend's cancellation (its class is not reachable from a worker thread)
        return True
    # A cancelled scope has an effective deadline of -inf (anyio's documented marker).
    return anyio.current_effective_deadline() == -math.inf
