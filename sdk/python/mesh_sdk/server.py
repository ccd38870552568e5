"""A tools bundle's server: MCP over stdio, served by the `mcp` library's MCPServer."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from . import eras
from .log import setup_logging
from .names import check_tool_name, seat_verb
from .stdio import stdio_transport, streams_supported

F = TypeVar("F", bound=Callable[..., Any])


class Server:
    """The tools of one bundle, served on stdio.

    Each tool is a plain function; its input schema comes from its type hints and its
    description from its docstring, as the `mcp` library derives them. Sync functions run in
    a worker thread and async ones on the event loop, and every call runs in its own task,
    so a slow call never holds up another one in flight.
    """

    def __init__(self, name: str | None = None, *, version: str = "", instructions: str | None = None) -> None:
        setup_logging()
        # The module's name is what the runtime knows the bundle by; fall back to it.
        self.mcp: MCPServer[Any] = MCPServer(
            name or os.environ.get("MESH_MODULE") or "mesh-bundle",
            version=version,
            instructions=instructions,
            log_level="WARNING",  # the library's own chatter; setup_logging already set the handler
        )

    def tool(
        self,
        name: str | None = None,
        *,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        structured_output: bool | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as a tool (named after it unless `name` is given)."""

        def register(fn: F) -> F:
            tool_name = check_tool_name(name or fn.__name__)
            self.mcp.add_tool(
                fn,
                name=tool_name,
                title=title,
                description=description,
                annotations=annotations,
                structured_output=structured_output,
            )
            return fn

        if callable(name):
            raise TypeError('use @server.tool() with parentheses, or @server.tool("name")')
        return register

    def seat_tool(self, seat: str, verb: str, **options: Any) -> Callable[[F], F]:
        """Register the decorated function as the implementation of `seat`'s `verb`."""
        return self.tool(seat_verb(seat, verb), **options)

    def run(self) -> None:
        """Serve on stdin/stdout until stdin closes, which is how the runtime says "exit now"."""
        import anyio  # the library's own event-loop runner (asyncio backend)

        try:
            anyio.run(self._serve_stdio)
        except KeyboardInterrupt:
            pass

    async def _serve_stdio(self) -> None:
        # The library's session and dispatch over the SDK's event-loop stdio transport (stdio.py:
        # the library's stdio_server costs a worker-thread round trip per line), in the era's
        # loop picked without a relay (eras.py).
        lowlevel = self.mcp._lowlevel_server
        _drop_idle_tracing(lowlevel.middleware)
        if not streams_supported():  # e.g. stdin or stdout redirected to a file: the library's threads can
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read, write):
                await lowlevel.run(read, write, lowlevel.create_initialization_options())
            return
        async with stdio_transport() as (read, write):
            await eras.serve(lowlevel, read, write)


def _drop_idle_tracing(middleware: list[Any]) -> None:
    """Take the library's OpenTelemetry span per request out when no tracer would record it.

    With only the OpenTelemetry API installed (no SDK configured: the global provider is still
    the proxy) every span is discarded, yet building it costs about 5 % of a call.
    """
    from mcp.server._otel import OpenTelemetryMiddleware
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        middleware[:] = [m for m in middleware if not isinstance(m, OpenTelemetryMiddleware)]


def result(text: str, structured: dict[str, Any] | None = None, *, is_error: bool = False) -> CallToolResult:
    """A tool result with a text for people and, optionally, structured content for programs."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured, is_error=is_error
    )
