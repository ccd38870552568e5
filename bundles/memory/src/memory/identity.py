"""Who a call is, for the memory: the one place that turns the caller the node stamped into an
author (what every write records) and an owner (whose private scope "private" names).

Today that is the mesh caller, `"<account>/<user>"` (or `"<account>"`), via `bus`, `local` or
`mcp`. The node will soon also stamp the person behind a session (`person: {iss, sub, name}`,
via `mcp` or `console`); then this function makes that person the author and the owner of
their own private scope (e.g. id `"<iss>#<sub>"`), and gives a `console` channel no private
scope at all (the seed: a private scope never appears in the console). Nothing else in the
module decides who someone is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .model import Writer


class Stamped(Protocol):
    """The caller as the SDK checked it (mesh_sdk.Caller); a protocol so the store's tests need no SDK."""

    @property
    def account(self) -> str: ...
    @property
    def via(self) -> str: ...
    @property
    def id(self) -> str: ...


def writer(caller: Stamped | None, meta: Mapping[str, Any] | None = None) -> Writer | None:
    """The author and owner of a call, or None for a call that carries no caller (run by hand).

    `meta` is the call's `_meta` as it came, for what the SDK does not check yet (the person);
    it is not read today.
    """
    if caller is None:
        return None
    return Writer(id=caller.id, account=caller.account, via=caller.via, owner=caller.id)
