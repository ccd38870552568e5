"""How a connection over the node's pipes is served: which protocol era, on which dispatcher.

The `mcp` library's `Server.run` (`serve_dual_era_loop`) peeks at the client's first request to
pick the protocol era (the 2025 handshake, or the 2026-07-28 per-request envelope), then copies
every later message through one more memory stream and task so the opening request can be
replayed; and its handshake loop runs on the library's stream-generic `JSONRPCDispatcher`.
Those two layers were about half of an `async def` tool's call (docs/performance.md, "The
Python SDK child"). Here:

- the pipe reader replays the opening request itself (no relay);
- a handshake connection, the one the node opens, is the library's own recipe for it
  (`Connection.for_loop`, `ServerRunner`, enveloped requests refused) on the SDK's
  `PipeDispatcher`, the library's `Dispatcher` seam implemented for the pipes;
- a 2026-07-28 connection is the library's own loop for that era, reading the pipe directly.

The era rule and the modern loop are private to the library (`mcp>=2.3,<3` is the SDK's range):
when a release lacks them in the shape used here, the SDK serves through the public
`Server.run` instead, which costs more per call but answers the same.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from mcp.server import runner
from mcp.server.connection import Connection
from mcp.shared.dispatcher import DispatchContext
from mcp.shared.exceptions import MCPError
from mcp.shared.transport_context import TransportContext
from mcp_types import INVALID_REQUEST

from .dispatcher import PipeDispatcher
from .stdio import PipeReader, PipeWriter

_MODERN = getattr(runner, "_serve_modern_stream", None)
_IS_MODERN = getattr(runner, "_has_modern_envelope", None)


def _fits(fn: Any, *names: str) -> bool:
    """Whether `fn` is an async function taking these keyword arguments (its shape in mcp 2.3)."""
    return inspect.iscoroutinefunction(fn) and set(names) <= set(inspect.signature(fn).parameters)


DIRECT = (
    callable(_IS_MODERN)
    and _fits(_MODERN, "lifespan_state", "raise_exceptions")
    and "init_options" in inspect.signature(runner.ServerRunner).parameters
    and callable(getattr(runner, "aclose_shielded", None))
)


async def serve(server: Any, read: PipeReader, write: PipeWriter) -> None:
    """Serve one connection (the node's pipes) on `server`, the library's low-level server."""
    if not DIRECT:
        await server.run(read, write, server.create_initialization_options())
        return
    assert _MODERN is not None and _IS_MODERN is not None
    try:
        async with server.lifespan(server) as state:
            opening = await read.opening()
            # The library's rule: an enveloped first request other than `initialize` opens the modern era.
            if opening is not None and opening.method != "initialize" and _IS_MODERN(opening.params):
                await _MODERN(server, read, write, lifespan_state=state, raise_exceptions=False)
            else:
                await _serve_handshake(server, read, write, state)
    finally:
        await write.aclose()


async def _serve_handshake(server: Any, read: PipeReader, write: PipeWriter, state: Any) -> None:
    """The library's handshake-era loop (`_serve_legacy_stream` in mcp 2.3) on the pipe dispatcher."""
    assert _IS_MODERN is not None
    # `initialize` inline: a client that sends its next request right behind it sees the
    # initialized state (the library's own reason).
    dispatcher = PipeDispatcher(read, write, inline_methods=frozenset({"initialize"}))
    connection = Connection.for_loop(dispatcher)
    kernel = runner.ServerRunner(server, connection, state, init_options=server.create_initialization_options())

    async def on_request(
        ctx: DispatchContext[TransportContext], method: str, params: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        if method != "initialize" and _IS_MODERN(params):
            raise MCPError(
                code=INVALID_REQUEST,
                message="this connection serves the handshake protocol era; "
                "requests carrying the 2026-07-28 envelope are not accepted on it",
            )
        return await kernel.on_request(ctx, method, params)

    try:
        await dispatcher.run(on_request, kernel.on_notify)
    finally:
        await runner.aclose_shielded(connection)
