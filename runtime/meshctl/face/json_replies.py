"""JSON replies, not an SSE stream, for the `tools/call` POSTs that cannot need a stream.

The `mcp` package's Streamable HTTP transport answers a 2025-11-25 session's POST either always
as one JSON body (`json_response=True`) or always as an SSE stream. A stream costs both ends
per call (the SSE framing, its writer task, the client's event parser) and is needed only for
messages sent while the call runs: the face sends those only for a call whose client asked
for progress. So `json_response` is given as `PerRequest`, a flag whose truth is this
request's: true for a `tools/call` without a `progressToken`, false for everything else
(`initialize` included, so the session's own tasks, which copy the context they start in,
see false and keep routing a progress call's notifications to its stream). The face's HTTP
front (http_front.py) sets it for each request it hands to the package.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_json_reply: contextvars.ContextVar[bool] = contextvars.ContextVar("mesh_face_json_reply", default=False)


class PerRequest:
    """The truth of `json_response` for the request being handled (the transport tests it with `if`)."""

    def __bool__(self) -> bool:
        return _json_reply.get()


def wants_json(body: bytes) -> bool:
    """A tools/call or tools/list with no progress token: nothing but the result goes back (as on the
    hot path). A false "no" costs a stream only."""
    return (b'"tools/call"' in body or b'"tools/list"' in body) and b"progressToken" not in body


@contextmanager
def replying_as_json(flag: bool) -> Iterator[None]:
    """`PerRequest` is `flag` for the request handled inside (and the tasks it starts)."""
    token = _json_reply.set(flag)
    try:
        yield
    finally:
        _json_reply.reset(token)
