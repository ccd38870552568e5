"""The face's one HTTP entry: every POST to the endpoint is read here, `HotPath.decide` says which
way it goes, and a hot request is answered here as one JSON body; the rest go on, body replayed,
to the `mcp` package's Streamable HTTP app (sessions, `initialize`, `server/discover`, streams,
progress calls, errors).

What a hot request must show first, else it is the package's (which answers it as it always did):
- the endpoint's path, `Content-Type: application/json`, an `Accept` that takes JSON, a Host and
  an Origin the transport security settings allow (the same rules as the package's);
- a 2025-11-25 (or older) request: an `Mcp-Session-Id` of a live session of this face, opened with
  no credential, whose `initialize` was accepted; the call is counted as the session's request in
  flight (so its idle clock stops, as the package's transport does);
- a 2026-07-28 request: its routing headers once each, no `Mcp-Param-*` header, and the envelope
  and headers checked by `decide`.

A 2025-11-25 client cancels a call with a `notifications/cancelled` POST on its session: one for a
hot call is taken here (202) and the call's bus call is cancelled (the node tells the tool); the
cancelled request's POST is answered REQUEST_CANCELLED, as the package's transport answers it.
Auth is auth.py's `Gate`, in front of this: a request reaches the front with its token verified,
its person in the scope (passed with a hot call) and its owner, which `_legacy_era` compares with
the session's (another person's session goes the package's way, which answers 404).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import anyio
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.meshctl.face.auth import OWNER_KEY, PERSON_KEY
from runtime.meshctl.face.hot import Era, HotCall, HotCancel, HotList, cancelled_response
from runtime.meshctl.face.json_replies import replying_as_json, wants_json
from runtime.meshctl.face.server import Face
from runtime.meshctl.face.workers import ToSessions, is_session_era
from runtime.wire.identity import Person

log = logging.getLogger("mesh.face")

ROUTING_HEADERS = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")
VERDICTS_KEPT = 64  # distinct Host / Origin / Accept values whose verdict is remembered
RUNNING_PER_SESSION = 4096  # hot calls of one session in flight; past it, calls go the package's way

_JSON = b"application/json"


class FaceFront:
    """ASGI app: the hot path for what it takes, `app` (the package's) for everything else."""

    def __init__(
        self,
        app: ASGIApp,
        face: Face,
        security: TransportSecuritySettings | None,
        *,
        path: str = "/mcp",
        max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
        to_sessions: ToSessions | None = None,
    ) -> None:
        self.app, self.face, self.path, self.max_body = app, face, path, max_body
        self.security = security
        self.to_sessions = to_sessions  # a worker other than 0: 2025-11-25 requests are worker 0's
        self.manager = getattr(face.server, "_session_manager", None)  # set by streamable_http_app
        self._verdicts: dict[tuple[int, bytes], bool] = {}
        # session id -> request id -> the cancel handle of a hot call in flight
        self._running: dict[str, dict[int | str, asyncio.Timeout]] = {}
        self.served = 0  # requests answered here (tests and the bench read it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        if self.to_sessions is not None and is_session_era(scope):
            body, complete, trailing = await _read_body(receive, self.max_body)
            if complete:
                await self.to_sessions(scope, body, receive, send)  # worker 0 holds the sessions (workers.py)
            elif trailing is None:
                await self.app(
                    scope, _replay([{"type": "http.request", "body": body, "more_body": True}], receive), send
                )
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, complete, trailing = await _read_body(receive, self.max_body)
        if complete:
            headers = _Headers(scope["headers"])
            era, session = self._era(headers, scope.get(OWNER_KEY))
            decision = self.face.hot.decide(body, era) if era is not None else None
            if decision is not None:
                self.served += 1
                if isinstance(decision, HotCall):
                    await self._call(decision, session, send, scope.get(PERSON_KEY))
                elif isinstance(decision, HotList):
                    await _answer(send, self.face.hot.list_page(decision), session)
                else:
                    self._cancel(decision, session)
                    await send({"type": "http.response.start", "status": 202, "headers": []})
                    await send({"type": "http.response.body", "body": b""})
                return
        replayed: list[Message] = [{"type": "http.request", "body": body, "more_body": not complete}]
        if trailing is not None:
            replayed.append(trailing)
        # A 2025-11-25 tools/call with no progress token is answered by the package as one JSON body too.
        with replying_as_json(complete and wants_json(body)):
            await self.app(scope, _replay(replayed, receive), send)

    # --- which era, and is it one the hot path may serve --------------------------------------
    def _era(self, headers: _Headers, owner: object = None) -> tuple[Era | None, _Session | None]:
        if headers.duplicated or headers.params or not headers.content_json:
            return None, None
        if not (
            self._allowed(0, headers.host) and self._allowed(1, headers.origin) and self._allowed(2, headers.accept)
        ):
            return None, None
        version = headers.routing.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            if version not in MODERN_PROTOCOL_VERSIONS:
                return None, None
            return Era(version, headers=headers.routing), None
        return self._legacy_era(headers.session_id, owner)

    def _legacy_era(self, session_id: str | None, owner: object = None) -> tuple[Era | None, _Session | None]:
        manager = self.manager
        if session_id is None or manager is None:
            return None, None
        instances = getattr(manager, "_server_instances", None)
        owners = getattr(manager, "_session_owners", None)
        if not isinstance(instances, dict) or not isinstance(owners, dict):
            return None, None  # a release of mcp that keeps its sessions otherwise: the package's way
        transport = instances.get(session_id)
        if transport is None or getattr(transport, "is_terminated", True) or owners.get(session_id) != owner:
            return None, None  # unknown, ended, or another's (auth.py's token owner): the package answers 404
        idle = getattr(transport, "idle_scope", None)
        if idle is not None and (idle.cancel_called or not hasattr(transport, "_requests_in_flight")):
            return None, None
        connection = self.face.by_session_id.get(session_id)
        if connection is None or not connection.initialize_accepted:
            return None, None
        version = connection.protocol_version
        if version not in HANDSHAKE_PROTOCOL_VERSIONS or _answers(connection):
            return None, None  # (a client that answers a tool's asks: the package's way, face/asking.py)
        running = self._running.get(session_id)
        session = _Session(session_id, transport)
        return Era(version, running=running.keys() if running else frozenset()), session

    def _allowed(self, which: int, value: bytes | None) -> bool:
        if value is None:
            return which != 0 and which != 2  # no Host or no Accept: the package answers; no Origin: same-origin
        key = (which, value)
        verdict = self._verdicts.get(key)
        if verdict is None:
            text = value.decode("latin-1")
            verdict = _accepts_json(text) if which == 2 else _security_allows(self.security, which, text)
            if len(self._verdicts) >= VERDICTS_KEPT:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    # --- answering ----------------------------------------------------------------------------
    async def _call(self, hot: HotCall, session: _Session | None, send: Send, person: Person | None = None) -> None:
        if session is None:
            await _answer(send, await self.face.hot.call(hot, person), None)
            return
        running = self._running.setdefault(session.id, {})
        if hot.id in running or len(running) >= RUNNING_PER_SESSION:
            # The same id twice at once (a client bug) or a flood: the package's way judges it.
            await _answer(send, await self.face.hot.call(hot, person), session)
            return
        with _holding(session.transport):
            handle = asyncio.timeout(None)  # the client's notifications/cancelled ends it (`_cancel`)
            try:
                async with handle:
                    running[hot.id] = handle
                    try:
                        answer = await self.face.hot.call(hot, person)
                    finally:
                        running.pop(hot.id, None)
                        if not running:
                            self._running.pop(session.id, None)
            except TimeoutError:
                if not handle.expired():
                    raise
                answer = cancelled_response(hot.id)
            await _answer(send, answer, session)

    def _cancel(self, cancel: HotCancel, session: _Session | None) -> None:
        handle = self._running.get(session.id, {}).get(cancel.request_id) if session is not None else None
        if handle is not None and handle.when() is None:
            handle.reschedule(asyncio.get_running_loop().time())  # ends the call's block at once


class _Session:
    __slots__ = ("id", "transport")

    def __init__(self, session_id: str, transport: Any) -> None:
        self.id, self.transport = session_id, transport


class _Headers:
    """The request headers the front looks at, read in one pass."""

    __slots__ = ("host", "origin", "accept", "session_id", "routing", "duplicated", "params", "content_json")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.host = self.origin = self.accept = None
        self.session_id: str | None = None
        self.routing: dict[str, str] = {}
        self.duplicated = self.params = self.content_json = False
        for name, value in raw:
            if name == b"content-type":
                self.content_json = value.split(b";", 1)[0].strip() == _JSON
            elif name == b"host":
                self.host = value
            elif name == b"accept":
                self.accept = value
            elif name == b"origin":
                self.origin = value
            elif name == b"mcp-session-id":
                self.session_id = value.decode("latin-1")
            elif name in ROUTING_HEADERS:
                key = name.decode()
                if key in self.routing:
                    self.duplicated = True
                self.routing[key] = value.decode("latin-1")
            elif name.startswith(b"mcp-param-"):
                self.params = True


def _accepts_json(accept: str) -> bool:
    """The package's rule (check_accept_headers): application/json, application/* or */*."""
    kinds = [part.strip().split(";")[0].strip().lower() for part in accept.split(",")]
    return any(k in ("application/json", "application/*", "*/*") for k in kinds)


def _security_allows(security: TransportSecuritySettings | None, which: int, value: str) -> bool:
    """The package's Host (0) and Origin (1) rules: listed exactly, or a listed `name:*` with any port."""
    if security is None or not security.enable_dns_rebinding_protection:
        return True
    allowed = security.allowed_hosts if which == 0 else security.allowed_origins
    if value in allowed:
        return True
    return any(a.endswith(":*") and value.startswith(a[:-2] + ":") for a in allowed)


class _holding:
    """The hot call as the session's request in flight: the package's idle clock waits for it."""

    __slots__ = ("transport", "idle")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.idle = getattr(transport, "idle_scope", None)

    def __enter__(self) -> None:
        if self.idle is not None:
            self.transport._requests_in_flight += 1
            self.idle.deadline = math.inf

    def __exit__(self, *exc: object) -> None:
        if self.idle is not None:
            self.transport._requests_in_flight -= 1
            timeout = getattr(self.transport, "_idle_timeout", None)
            if not self.transport._requests_in_flight and timeout is not None:
                self.idle.deadline = anyio.current_time() + timeout


async def _answer(send: Send, body: bytes, session: _Session | None) -> None:
    headers = [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
    if session is not None:
        headers.append((b"mcp-session-id", session.id.encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool, Message | None]:
    """(the body, whether it is whole, a non-body message that came instead). Past `limit` bytes the
    rest is left unread: the package answers 413."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: the package hears it too
            return b"".join(chunks), False, message
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), True, None
        if size > limit:
            return b"".join(chunks), False, None


def _replay(first: list[Message], receive: Receive) -> Receive:
    async def replaying() -> Message:
        if first:
            return first.pop(0)
        return await receive()

    return replaying


def _answers(connection: Any) -> bool:
    caps = getattr(connection, "client_capabilities", None)
    return caps is not None and any(getattr(caps, k, None) is not None for k in ("elicitation", "sampling", "roots"))
