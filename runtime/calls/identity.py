"""The caller each `tools/call` carries in `_meta["mesh/caller"]`, made once per distinct server stamp."""

from __future__ import annotations

import msgspec

from runtime.wire.identity import CALLER_KEY, REQUEST_INFO, Caller, caller_from_info

_encode = msgspec.json.Encoder().encode


class CallerStamp:
    """The `_meta` bytes for each call: decoded once per distinct header, the local one made once.

    The header of a given caller repeats on every call it makes, so a small bounded cache keeps
    the decode and encode off the hot path.
    """

    CACHE_SIZE = 1024  # distinct callers remembered; past it the cache starts over

    def __init__(self, local: Caller, mcp_faces: frozenset[str] = frozenset()) -> None:
        self.local = local
        self.local_meta = self.meta(local)
        # Callers configured as MCP faces (`[identity] mcp_faces`: "account/user" or "account"):
        # their calls are marked via "mcp". Read from the server's stamp only, so no client can
        # claim it; a face is a NATS user of its own in a caller account.
        self.mcp_faces = mcp_faces
        self._cache: dict[str, bytes] = {}

    def _via(self, caller: Caller) -> Caller:
        if caller.id in self.mcp_faces or caller.account in self.mcp_faces:
            return msgspec.structs.replace(caller, via="mcp")
        return caller

    @staticmethod
    def meta(caller: Caller) -> bytes:
        """The `_meta` object of a `tools/call` holding this caller, as JSON bytes."""
        return _encode({CALLER_KEY: caller})

    def for_headers(self, headers: dict[str, str] | None) -> bytes:
        """`_meta` for a request with these headers; CallerError when the stamp is unreadable."""
        value = headers.get(REQUEST_INFO) if headers else None
        if value is None:
            return self.local_meta
        meta = self._cache.get(value)
        if meta is None:
            meta = self.meta(self._via(caller_from_info(value)))
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            self._cache[value] = meta
        return meta
