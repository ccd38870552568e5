"""Who is calling: the caller a child sees as `_meta["mesh/caller"]`, from a source no client forges.

NATS accounts are the trust boundary. Nodes run in the mesh account, which exports
`mesh.tool.>` and `mesh.seat.>`; a caller's own account imports them with `share: true`, and
the server then stamps every request crossing that import with `Nats-Request-Info` (account,
user, client name), replacing whatever header the client sent. Inside the mesh account a
client's header passes unchanged: users of the mesh account are infrastructure, trusted like
the node itself. A request without the header came from inside the mesh account (or from a bus
without accounts) and carries the node's configured local identity, `via: "local"`.

Nothing else in a request (its arguments, other headers, an `_meta` in the arguments) is read.
"""

from __future__ import annotations

import getpass
import os
from typing import Literal

import msgspec

# Stamped by the NATS server on a request that crossed an account import (share: true).
REQUEST_INFO = "Nats-Request-Info"
CALLER_KEY = "mesh/caller"

# The server writes a few hundred bytes; a larger header did not come from it.
MAX_INFO_BYTES = 4096
# Account and user names are nkeys (56 characters) or configured names; a client name is chosen
# by the client for its own connection, so it is kept short and printable.
MAX_NAME_CHARS = 256

Via = Literal["bus", "local", "mcp"]


class Caller(msgspec.Struct, frozen=True):
    """The caller as the child receives it (the shared contract; field names are the wire's)."""

    account: str
    user: str | None = None
    name: str | None = None
    via: Via = "bus"

    @property
    def id(self) -> str:
        """The stable key modules use for author/owner: `<account>/<user>`, or `<account>`."""
        return f"{self.account}/{self.user}" if self.user else self.account


class _RequestInfo(msgspec.Struct):
    """The fields of the server's ClientInfo the node uses; the rest (rtt, host, ...) is ignored."""

    acc: str = ""
    user: str | None = None
    name: str | None = None


class CallerError(Exception):
    """A `Nats-Request-Info` header the node cannot read; only infrastructure can send one."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"the {REQUEST_INFO} header {problem}")


_decode_info = msgspec.json.Decoder(_RequestInfo).decode
_encode = msgspec.json.Encoder().encode


def _printable(text: str) -> bool:
    return text.isprintable() and len(text) <= MAX_NAME_CHARS


def caller_from_info(value: str) -> Caller:
    """The caller stamped by the server into `Nats-Request-Info`; CallerError when unreadable."""
    if len(value) > MAX_INFO_BYTES:
        raise CallerError(f"is {len(value)} bytes; the server writes at most a few hundred")
    try:
        info = _decode_info(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CallerError(f"is not the server's client info JSON ({e})") from None
    if not info.acc or not _printable(info.acc):
        raise CallerError("names no account (field acc)")
    if info.user is not None and not _printable(info.user):
        raise CallerError("has an unprintable or overlong user")
    name = info.name
    if name is not None and not _printable(name):
        # The client chose its connection name; an odd one is dropped, the account still stands.
        name = None
    return Caller(account=info.acc, user=info.user or None, name=name or None, via="bus")


def local_caller(local: str | None) -> Caller:
    """The node's local identity: `[identity] local`, "account" or "account/user"; default the OS user."""
    text = local or _os_user()
    account, _, user = text.partition("/")
    return Caller(account=account, user=user or None, name=None, via="local")


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's numeric uid): still someone
        return f"uid-{os.getuid()}"


def check_local(local: str) -> str | None:
    """Why a configured local identity is unusable, or None."""
    account, _, user = local.partition("/")
    if not account or not _printable(local) or "/" in user or (local.endswith("/")):
        return f'{local!r} is not an identity; write "account" or "account/user", e.g. "ops/alice"'
    return None
