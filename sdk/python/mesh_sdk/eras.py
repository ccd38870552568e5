"""Which of the `mcp` library's serving loops a connection gets, decided without a relay.

The library's `Server.run` (`serve_dual_era_loop`) peeks at the client's first request to pick
the protocol era (the 2025 handshake or the 2026-07-28 per-request envelope), then copies every
later message through one more memory stream and task so the opening request can be replayed.
That copy was about a fifth of an `async def` tool's call (docs/performance.md, "The Python SDK
child"). Here the pipe reader replays the opening request itself, and the era's own loop of the
library (`_serve_legacy_stream` / `_serve_modern_stream`) reads the pipe directly: the era
rule, the dispatcher, the sessions and the handlers stay the library's.

Those two loops are private to the library (`mcp>=2.3,<3` is the SDK's range): when a release
lacks them, the SDK serves through the public `Server.run` instead, which costs the relay but
answers the same.
"""

from __future__ import annotations

import inspect
from typing import Any

from mcp.server import runner

from .stdio import PipeReader, PipeWriter

_LEGACY = getattr(runner, "_serve_legacy_stream", None)
_MODERN = getattr(runner, "_serve_modern_stream", None)
_IS_MODERN = getattr(runner, "_has_modern_envelope", None)


def _fits(fn: Any, *names: str) -> bool:
    """Whether `fn` is an async function taking these keyword arguments (its shape in mcp 2.3)."""
    if not inspect.iscoroutinefunction(fn):
        return False
    return set(names) <= set(inspect.signature(fn).parameters)


DIRECT = (
    callable(_IS_MODERN)
    and _fits(_LEGACY, "lifespan_state", "session_id", "init_options", "raise_exceptions")
    and _fits(_MODERN, "lifespan_state", "raise_exceptions")
)


async def serve(server: Any, read: PipeReader, write: PipeWriter) -> None:
    """Serve one connection (the node's pipes) on `server`, the library's low-level server."""
    if not DIRECT:
        await server.run(read, write, server.create_initialization_options())
        return
    assert _LEGACY is not None and _MODERN is not None and _IS_MODERN is not None
    try:
        async with server.lifespan(server) as state:
            opening = await read.opening()
            # The library's rule: an enveloped first request other than `initialize` opens the modern era.
            if opening is not None and opening.method != "initialize" and _IS_MODERN(opening.params):
                await _MODERN(server, read, write, lifespan_state=state, raise_exceptions=False)
            else:
                await _LEGACY(
                    server,
                    read,
                    write,
                    lifespan_state=state,
                    session_id=None,
                    init_options=server.create_initialization_options(),
                    raise_exceptions=False,
                )
    finally:
        await write.aclose()
