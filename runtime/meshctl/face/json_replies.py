"""JSON replies, not an SSE stream, for the `tools/call` POSTs that cannot need a stream.

The `mcp` package's Streamable HTTP transport answers a 2025-11-25 session's POST either always
as one JSON body (`json_response=True`) or always as an SSE stream. A stream costs both ends
per call (the SSE framing, its writer task, the client's event parser) and is needed only for
messages sent while the call runs: the face sends those only for a call whose client asked
for progress. So `json_response` is given as `PerRequest`, a flag whose truth is this
request's: true for a `tools/call` without a `progressToken`, false for everything else
(`initialize` included, so the session's own tasks, which copy the context they start in,
see false and keep routing a progress call's notifications to its stream).
"""

from __future__ import annotations

import contextvars

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_json_reply: contextvars.ContextVar[bool] = contextvars.ContextVar("mesh_face_json_reply", default=False)
BODY_LOOKED_AT = 1024 * 1024  # a POST body longer than this is answered by a stream (no decision worth buffering it)


class PerRequest:
    """The truth of `json_response` for the request being handled (the transport tests it with `if`)."""

    def __bool__(self) -> bool:
        return _json_reply.get()


def wants_json(body: bytes) -> bool:
    """A tools/call with no progress token: nothing but the result goes back. A false "no" costs a stream only."""
    return b'"tools/call"' in body and b"progressToken" not in body


class JsonReplies:
    """ASGI middleware: reads a POST's body, decides, and hands the body on unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and size <= BODY_LOOKED_AT:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app hears it too
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed: list[Message] = [{"type": "http.request", "body": body, "more_body": more}]
        token = _json_reply.set(not more and wants_json(body))
        try:
            await self.app(scope, _replay(replayed, receive), send)
        finally:
            _json_reply.reset(token)


def _replay(first: list[Message], receive: Receive) -> Receive:
    async def replaying() -> Message:
        if first:
            return first.pop(0)
        return await receive()

    return replaying
