"""The caller each `tools/call` carries in `_meta["mesh/caller"]`, made once per distinct server stamp.

The rules (docs/internals.md, "Caller identity"):

- On a bus whose stamps the node believes (`stamped`: accounts, and a mesh account that cannot
  publish calls; runtime/bus/trust.py), a call's `Nats-Request-Info` is the server's: its caller
  goes to the child, `via: "bus"`. The embedded bus's own operator user (`meshctl call` run by
  the node's OS user) is the node's local identity, `via: "local"`. A call without a stamp can
  only come from inside the mesh account: local as well.
- A delegate (`[identity] delegates`, matched on the stamp's account and user) has its calls
  marked with its channel (`via: "mcp"` or `"console"`) and may name the person behind one call
  in `Mesh-Person`; from any other caller a person is refused (400, naming why).
- On a bus without accounts, or whose mesh account may publish calls, no header is believed:
  every caller is local, whatever it sends (the node says so once at start and in its status).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from runtime.wire.identity import (
    CALLER_KEY,
    PERSON,
    REQUEST_INFO,
    Caller,
    CallerError,
    Via,
    caller_from_info,
    person_from_header,
)

_encode = msgspec.json.Encoder().encode

Listed = tuple[str, str | None]  # (account, user); user None: every user of the account


class CallerStamp:
    """The `_meta` bytes for each call: decoded once per distinct header, the local one made once.

    The header of a given caller repeats on every call it makes, so a small bounded cache keeps
    the decode and encode off the hot path.
    """

    CACHE_SIZE = 1024  # distinct (stamp, person) pairs remembered; past it the cache starts over

    def __init__(
        self,
        local: Caller,
        delegates: Mapping[Listed, Via] | None = None,
        *,
        stamped: bool = True,
        operator: Listed | None = None,
    ) -> None:
        self.local = local
        self.local_meta = self.meta(local)
        self.stamped = stamped  # False: the bus vouches for nobody, every caller is local
        self.operator = operator  # the embedded bus's own operator user: the local identity
        self.delegates: dict[Listed, Via] = dict(delegates or {})
        self._cache: dict[str | tuple[str, str], bytes] = {}

    def set_delegates(self, delegates: Mapping[Listed, Via]) -> None:
        """The delegates from now on (a caller added or removed); what was cached is made again."""
        self.delegates = dict(delegates)
        self._cache.clear()

    def delegate_via(self, caller: Caller) -> Via | None:
        found = self.delegates.get((caller.account, caller.user))
        return found if found is not None else self.delegates.get((caller.account, None))

    @staticmethod
    def meta(caller: Caller) -> bytes:
        """The `_meta` object of a `tools/call` holding this caller, as JSON bytes."""
        return _encode({CALLER_KEY: caller})

    def for_headers(self, headers: Mapping[str, str] | None, person: str | None = None) -> bytes:
        """`_meta` for a request with these headers (`person`: its Mesh-Person, as the call protocol
        read it); CallerError when the stamp is unreadable or the person may not be believed."""
        if not self.stamped:
            return self.local_meta
        info = headers.get(REQUEST_INFO) if headers else None
        if info is None:
            if person is not None:
                raise CallerError(
                    "comes from inside the mesh account, where the server stamps nobody; only a delegate "
                    "([identity] delegates) calling from its own account passes a person",
                    PERSON,
                )
            return self.local_meta
        key: str | tuple[str, str] = info if person is None else (info, person)
        meta = self._cache.get(key)
        if meta is None:
            meta = self._make(info, person)
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = meta
        return meta

    def _make(self, info: str, person: str | None) -> bytes:
        caller = caller_from_info(info)
        via = self.delegate_via(caller)
        if via is None:
            if person is not None:
                raise CallerError(
                    f"is refused: caller {caller.id} is not a delegate; only a caller listed in the node's "
                    "[identity] delegates (an MCP face, a console) passes the person behind a call; leave it out",
                    PERSON,
                )
            if self.operator is not None and (caller.account, caller.user) == self.operator:
                return self.local_meta
            return self.meta(caller)
        named = None if person is None else person_from_header(person)
        return self.meta(msgspec.structs.replace(caller, via=via, person=named))
