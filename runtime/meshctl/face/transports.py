"""The face over stdio (one client, the process's stdin/stdout) or Streamable HTTP (many).

HTTP is the `mcp` package's Streamable HTTP app: one endpoint (`/mcp`) that speaks both the
2025-11-25 session (`initialize`, `Mcp-Session-Id`) and the 2026-07-28 stateless revision
(`server/discover`), behind the face's front (http_front.py), which answers the hot path's
requests itself. The Host and Origin of every request are checked: a browser page of another
origin cannot reach the mesh's tools through a face on this machine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import tempfile
from typing import Iterator, cast

import anyio
import uvicorn
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from runtime.meshctl.face.auth import Gate, HttpSettings, is_loopback
from runtime.meshctl.face.http_front import FaceFront
from runtime.meshctl.face.json_replies import PerRequest
from runtime.meshctl.face.limits import guarded_protocol
from runtime.meshctl.face.server import Face
from runtime.meshctl.face.stdio_front import pipes_on_stdio, serve_stdio_front
from runtime.meshctl.face.workers import ToSessions, reuseport_socket, run_workers, unix_socket

log = logging.getLogger("mesh.face")


def http_security(host: str, allow_origins: list[str], hosts: set[bytes] | None = None) -> TransportSecuritySettings:
    """Who may talk to the endpoint: the Host values the face answers for (`hosts`, exact: auth.py's
    Gate checks them first), loopback origins and those allowed by name. Whether a non-loopback
    address may be bound at all is auth.py's `load_http_settings`."""
    if hosts is not None:
        allowed = sorted(h.decode("latin-1") for h in hosts)
    else:
        allowed = ["127.0.0.1:*", "localhost:*", "[::1]:*"] + ([] if is_loopback(host) else [f"{host}:*"])
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"] + allow_origins
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=allowed, allowed_origins=origins
    )


async def serve_stdio(face: Face) -> None:
    """One MCP client on stdin/stdout until it closes them: through the hot path's front when they
    are pipes (as a client that starts the face gives it), else the package's stdio server alone."""
    async with anyio.create_task_group() as tg:
        await tg.start(face.watch)
        if face.hot.enabled and pipes_on_stdio():
            await serve_stdio_front(face)
        else:
            async with stdio_server() as (read_stream, write_stream):
                await face.server.run(read_stream, write_stream, face.server.create_initialization_options())
        tg.cancel_scope.cancel()


async def serve_http(
    face: Face,
    host: str,
    port: int,
    security: TransportSecuritySettings,
    settings: HttpSettings,
    *,
    workers: int = 1,
    worker: int = 0,
    sessions_socket: str | None = None,
) -> None:
    """Streamable HTTP on http://host:port/mcp until cancelled; `security` from `http_security`.

    `workers` > 1: this process is worker `worker` of that many on the port (workers.py): worker 0
    starts the others and holds every 2025-11-25 session, the others pass that era on to it."""
    # json_response is read with `if` per request: PerRequest is true for a tools/call with no progress token.
    bounds = settings.http
    app = face.server.streamable_http_app(
        host=host,
        transport_security=security,
        max_sessions=bounds.max_sessions,
        session_idle_timeout=bounds.session_idle_s,
        json_response=cast(bool, PerRequest()),
    )
    to_sessions = ToSessions(sessions_socket) if worker > 0 and sessions_socket else None
    front = FaceFront(app, face, security, to_sessions=to_sessions)
    gate = Gate(front, settings)  # Host, tokens, session caps (auth.py): every request meets it first
    gate.manager = front.manager
    config = uvicorn.Config(
        gate,
        host=host.strip("[]"),
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
        proxy_headers=False,  # the face is the endpoint, not behind a proxy it should trust: one layer less a request
        http=guarded_protocol(bounds.header_timeout_s, bounds.body_timeout_s) or http_protocol(),
    )
    server = _Uvicorn(config)
    with contextlib.ExitStack() as sockets_stack:
        sockets: list[socket.socket] | None = None
        private: str | None = None
        if workers > 1:
            sockets = [sockets_stack.enter_context(reuseport_socket(host, port))]
            if worker == 0:
                private = tempfile.mkdtemp(prefix="meshctl-mcp-")  # 0700: only this user reaches the sessions
                sessions_socket = os.path.join(private, "sessions.sock")
                sockets.append(sockets_stack.enter_context(unix_socket(sessions_socket)))
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(face.watch)
                if worker == 0 and workers > 1 and sessions_socket is not None:
                    await tg.start(run_workers, workers, sessions_socket)

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            server.should_exit = True  # uvicorn closes its sessions and returns from serve()
                            return

                tg.start_soon(stop_on_signal)
                which = f" (worker {worker} of {workers})" if workers > 1 else ""
                auth = f"; bearer tokens of {settings.auth.issuer}" if settings.on else ""
                log.info(
                    "MCP face on http://%s:%d/mcp%s (%d tools)%s", host, port, which, len(face.catalog.tools), auth
                )
                await server.serve(sockets=sockets)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await gate.aclose()
                if to_sessions is not None:
                    await to_sessions.aclose()
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)


def http_protocol() -> str:
    """httptools (C) when installed: bench/face_servers.py measured uvicorn with it against granian."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the face's task group owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
