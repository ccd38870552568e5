"""What a tool handler learns about its own call: who called, whether it was cancelled, progress.

All three read the call's `Context` (a handler gets it by declaring a parameter annotated
`Context`). Nothing here runs unless a handler asks, so a call that does not use them costs
nothing more than before.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mcp.server.mcpserver import Context

# The key the node sets on every tools/call's params._meta (the mesh's shared contract).
CALLER_META_KEY = "mesh/caller"
VIAS = ("bus", "local", "mcp")
# An identity part longer than this is not from the node; refusing it keeps logs and keys sane.
_MAX_PART = 256

_log = logging.getLogger("mesh_sdk")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made this call, as the node stamped it (never taken from the call's arguments)."""

    account: str  # the NATS account the request came from (server-stamped)
    user: str | None  # the user inside that account, when the account shares it
    name: str | None  # the client connection's name, when it gave one
    via: Literal["bus", "local", "mcp"]  # the channel: the bus, the node's own account, the MCP face

    @property
    def id(self) -> str:
        """The stable key for this caller: "<account>/<user>", or "<account>" without a user."""
        return f"{self.account}/{self.user}" if self.user else self.account


def _part(value: Any, *, required: bool) -> str | None:
    """One identity field: a non-empty string of bounded length, or None when optional and absent."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_PART or not value.isprintable():
        raise ValueError(value)
    return value


def parse_caller(raw: Any) -> Caller | None:
    """The caller from a `_meta["mesh/caller"]` value; None when absent or malformed.

    Malformed never raises: a handler asked who is calling gets "nobody I can vouch for"
    rather than a crash, and the value is logged (repr, one line) for whoever debugs the node.
    """
    if raw is None:
        return None
    try:
        if not isinstance(raw, Mapping):
            raise ValueError(raw)
        via = raw.get("via")
        if via not in VIAS:
            raise ValueError(via)
        return Caller(
            account=_part(raw.get("account"), required=True),  # type: ignore[arg-type]
            user=_part(raw.get("user"), required=False),
            name=_part(raw.get("name"), required=False),
            via=via,
        )
    except ValueError:
        _log.warning("ignored a malformed %s in the call's _meta: %.200r", CALLER_META_KEY, raw)
        return None


def _meta(ctx: Context[Any, Any]) -> Mapping[str, Any]:
    try:
        meta = ctx.request_context.meta
    except ValueError:  # a Context outside a request (e.g. a tool called directly in a test)
        return {}
    return meta if isinstance(meta, Mapping) else {}


def caller(ctx: Context[Any, Any]) -> Caller | None:
    """The caller of this tool call, or None when the call carries none (e.g. run by hand)."""
    return parse_caller(_meta(ctx).get(CALLER_META_KEY))


async def progress(ctx: Context[Any, Any], progress: float, total: float | None = None, message: str | None = None) -> None:
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
