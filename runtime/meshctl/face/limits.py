"""Bounds of the HTTP face under many clients, each one saying so when it is hit.

- `SessionCaps`: 2025-11-25 sessions per person (per client address without auth), beside the
  package's global cap: a person past it gets 429 naming the cap, not a session.
- `guarded_protocol`: uvicorn's httptools protocol with two clocks per request: its headers must
  be whole within `header_s` of its first byte (or of the connection's start), and its body within
  `body_s` of its headers; past either the connection gets 408 and is closed. Without them one slow
  client holds a connection (and a session's request) as long as it likes, and a few hundred hold
  the face (slowloris).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.types import Message, Scope, Send

log = logging.getLogger("mesh.face")

SAID_EVERY_S = 60.0  # a bound hit again and again is logged once a minute, with the count


class _Said:
    """A WARNING the first time a bound is hit, then at most once a minute with how often."""

    def __init__(self, what: str) -> None:
        self.what, self.count, self.last = what, 0, -1e9

    def hit(self, detail: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= SAID_EVERY_S:
            log.warning("%s (%d times so far): %s", self.what, self.count, detail)
            self.last = now


def opening(scope: Scope) -> bool:
    """A request that would open a 2025-11-25 session: no session id, no modern protocol version."""
    for name, value in scope["headers"]:
        if name == b"mcp-session-id":
            return False
        if name == b"mcp-protocol-version" and value >= b"2026":
            return False
    return True


class SessionCaps:
    def __init__(self, per_person: int) -> None:
        self.per_person = per_person
        self._who: dict[str, tuple[str, str]] = {}  # session id -> whose it is
        self._said = _Said("a person reached the face's sessions_per_person cap")

    def refusal(self, who: tuple[str, str], manager: Any) -> bytes | None:
        """The 429 body when `who` already holds `per_person` live sessions, else None."""
        live = getattr(manager, "_server_instances", None)
        if not isinstance(live, dict):
            return None
        for session_id in [s for s in self._who if s not in live]:
            del self._who[session_id]
        held = sum(1 for w in self._who.values() if w == who)
        if held < self.per_person:
            return None
        shown = f"{who[0]} {who[1]}"
        self._said.hit(shown)
        message = (
            f"{shown} already holds {held} sessions on this face (sessions_per_person = {self.per_person}); "
            "end one (DELETE it), or let an idle one time out"
        )
        return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}).encode()

    def recording(self, send: Send, who: tuple[str, str]) -> Send:
        """`send`, noting whose the session is when the answer opens one."""

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        self._who[value.decode("latin-1")] = who
            await send(message)

        return sending


_slow = _Said("a client sent a request too slowly; its connection got 408 and was closed")


def guarded_protocol(header_s: float, body_s: float) -> type[asyncio.Protocol] | None:
    """httptools' protocol with the two clocks; None when httptools is not installed (h11: no clocks)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        log.warning("httptools is not installed: the face's header and body timeouts are off")
        return None

    class Guarded(HttpToolsProtocol):
        _clock: asyncio.TimerHandle | None = None

        def _arm(self, seconds: float, what: str) -> None:
            if self._clock is not None:
                self._clock.cancel()
            self._clock = self.loop.call_later(seconds, self._expired, what, seconds)

        def _disarm(self) -> None:
            if self._clock is not None:
                self._clock.cancel()
                self._clock = None

        def _expired(self, what: str, seconds: float) -> None:
            self._clock = None
            if self.transport is None or self.transport.is_closing():
                return
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            _slow.hit(f"{client}: its {what} took over {seconds:g} s ({what}_timeout_s)")
            cycle = self.cycle
            if cycle is None or not cycle.response_started:
                text = f"the request's {what} did not come within {seconds:g} s".encode()
                head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                self.transport.write(head + b"content-length: " + str(len(text)).encode() + b"\r\n\r\n" + text)
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(header_s, "header")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(header_s, "header")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm(body_s, "body")

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return Guarded
