"""`meshctl mcp --http HOST:PORT --workers N`: N face processes on one port.

Every worker binds the port with SO_REUSEPORT, so the kernel spreads the clients' connections over
them, and each has its own bus connection, catalog and hot path: a stateless 2026-07-28 request
carries everything it needs, so any worker answers it. A 2025-11-25 session lives in memory in the
worker that answered its `initialize`, and SO_REUSEPORT picks a worker by connection, not by
session (a client's next request may come on another connection). So every request of that era
(no MCP-Protocol-Version header, or a 2025-11-25 or older one: `initialize`, its calls, its GET
stream, its DELETE) is served by worker 0: the others pass it on, as it came, to worker 0 over a
Unix socket in a private folder (0700) and stream the answer back. Worker 0 is the process started
as `meshctl mcp`; it starts the others (`--worker I`) and ends them when it ends; a worker whose
parent is gone ends itself (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
from typing import Any

import anyio
import anyio.abc
import httpx2
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Receive, Scope, Send

log = logging.getLogger("mesh.face")
logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per passed-on request is not news

MAX_WORKERS = 64
PARENT_ENV = "MESH_FACE_PARENT"  # the pid of worker 0, for the others (a worker whose parent is gone ends)
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"content-length", b"trailer"}


def reuseport_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on host:port that other workers of this user may bind too."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def unix_socket(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when the one that started it ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.warning("this system cannot end a face worker with its parent (no prctl)")


def worker_argv(index: int, sessions: str) -> list[str]:
    """This process's own command line, as worker `index` of the same face."""
    argv = [a for a in sys.argv[1:]]
    return [sys.executable, "-m", "runtime.meshctl", *argv, "--worker", str(index), "--sessions-socket", sessions]


async def run_workers(count: int, sessions: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    """Workers 1..count-1, each owned by a task here; ends them when cancelled. A worker that exits
    on its own is said and not restarted (the others go on serving)."""
    async with anyio.create_task_group() as tg:
        for index in range(1, count):
            tg.start_soon(_one_worker, index, sessions)
        task_status.started()


async def _one_worker(index: int, sessions: str) -> None:
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    process = await anyio.open_process(worker_argv(index, sessions), stdin=None, stdout=None, stderr=None, env=env)
    try:
        code = await process.wait()
        log.warning("face worker %d exited with code %s; the other workers go on serving", index, code)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()


def is_session_era(scope: Scope) -> bool:
    """A request of the 2025-11-25 era (or older): its session lives in worker 0."""
    for name, value in scope["headers"]:
        if name == b"mcp-protocol-version":
            return value.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS
    return True


class ToSessions:
    """Passes a request on to worker 0 over its Unix socket, and its answer (a stream too) back."""

    def __init__(self, path: str) -> None:
        self.client = httpx2.AsyncClient(
            transport=httpx2.AsyncHTTPTransport(uds=path), timeout=httpx2.Timeout(None, connect=10)
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __call__(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP]
        query = scope.get("query_string", b"")
        url = "http://face" + scope["path"] + (("?" + query.decode("latin-1")) if query else "")
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()  # the client went away: so does the request to worker 0

            tg.start_soon(watch_disconnect)
            try:
                response = await self.client.send(request, stream=True)
            except httpx2.HTTPError as e:
                log.warning("worker 0 did not take a 2025-11-25 request: %s", e)
                await _plain(send, 503, b"the face's session worker is not answering; try again in a moment")
                tg.cancel_scope.cancel()
                return
            try:
                kept = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
                length = response.headers.get("content-length")
                if length is not None:
                    kept.append((b"content-length", length.encode()))
                await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                await response.aclose()
            tg.cancel_scope.cancel()


async def _plain(send: Send, status: int, text: bytes) -> None:
    headers: list[Any] = [(b"content-type", b"text/plain"), (b"content-length", str(len(text)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})
