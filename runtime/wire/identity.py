"""Who is calling: the caller a child sees as `_meta["mesh/caller"]`, from a source no client forges.

NATS accounts are the trust boundary. Nodes run in the mesh account, which exports
`mesh.tool.>` and `mesh.seat.>`; a caller's own account imports them with `share: true`, and
the server then stamps every request crossing that import with `Nats-Request-Info` (account,
user, client name), replacing whatever header the client sent. Inside one account the server
passes a client's header as sent, so the node believes a stamp only on a bus whose mesh account
cannot publish calls at all (runtime/bus/trust.py says which buses are such; the embedded bus
is). There every call crossed an import and carries the server's stamp.

A delegate (a caller listed in `[identity] delegates`: an MCP face, a web console) may name the
person behind one call in `Mesh-Person`; the node believes it only from a listed delegate.
Nothing else in a request (its arguments, other headers, an `_meta` in the arguments) is read.

`Caller.id` is the one key modules use for author and owner. It is unambiguous: names are
escaped (`%`, `/` and `:` as `%25`, `%2F`, `%3A`), so `a` + `b/c` and `a/b` + `c` differ; a
local caller's id starts `local:` and a person's `person:`, which a bus caller's never does.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from typing import Literal

import msgspec

# Stamped by the NATS server on a request that crossed an account import (share: true).
REQUEST_INFO = "Nats-Request-Info"
# The person behind a delegate's call (docs/bus.md): {"iss", "sub", "name"} as JSON.
PERSON = "Mesh-Person"
CALLER_KEY = "mesh/caller"

# The server writes a few hundred bytes; a larger header did not come from it.
MAX_INFO_BYTES = 4096
MAX_PERSON_BYTES = 1024
# Account and user names are nkeys (56 characters) or configured names; a client name is chosen
# by the client for its own connection, so it is kept short and printable. A person's fields too.
MAX_NAME_CHARS = 256

Via = Literal["bus", "local", "mcp", "console"]
DELEGATE_VIAS: tuple[Via, ...] = ("mcp", "console")


class Person(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The human behind a delegate's call: the issuer that vouched for them and their subject there."""

    iss: str
    sub: str
    name: str | None = None  # shown to people; the node fills it with `sub` when the delegate gave none

    @property
    def id(self) -> str:
        return f"person:{escape(self.iss)}/{escape(self.sub)}"


class Caller(msgspec.Struct, frozen=True, omit_defaults=True):
    """The caller as the child receives it (the shared contract; field names are the wire's).

    `person` is there only when a delegate passed one; it is left out of the wire form otherwise.
    """

    account: str
    user: str | None
    name: str | None
    via: Via
    person: Person | None = None

    @property
    def id(self) -> str:
        """The key modules use for author/owner (see the module's docstring): who acts on this call."""
        return caller_id(self.account, self.user, self.via, self.person)


def escape(text: str) -> str:
    """A name as it stands in an id: `%`, `/` and `:` percent-encoded, nothing else changed."""
    if "%" in text or "/" in text or ":" in text:
        return text.replace("%", "%25").replace("/", "%2F").replace(":", "%3A")
    return text


def caller_id(account: str, user: str | None, via: str, person: Person | None = None) -> str:
    """`<account>[/<user>]` for a bus caller, `local:` before it for the local one, a person's own id."""
    if person is not None:
        return person.id
    base = escape(account) if user is None else f"{escape(account)}/{escape(user)}"
    return f"local:{base}" if via == "local" else base


class _RequestInfo(msgspec.Struct):
    """The fields of the server's ClientInfo the node uses; the rest (rtt, host, ...) is ignored."""

    acc: str = ""
    user: str | None = None
    name: str | None = None


class CallerError(Exception):
    """A caller header the node will not take: a stamp it cannot read, a person it may not believe."""

    def __init__(self, problem: str, header: str = REQUEST_INFO) -> None:
        self.problem = problem
        self.header = header
        super().__init__(f"the {header} header {problem}")


_decode_info = msgspec.json.Decoder(_RequestInfo).decode
_decode_person = msgspec.json.Decoder(Person).decode


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


def person_from_header(value: str) -> Person:
    """The person a delegate named in `Mesh-Person`; CallerError saying what is wrong and what is right."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_PERSON_BYTES:
        raise CallerError(f"is {size} bytes; at most {MAX_PERSON_BYTES}", PERSON)
    try:
        person = _decode_person(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CallerError(
            f'is not a person: give JSON {{"iss": "<issuer>", "sub": "<subject>", "name": "<shown name>"}} ({e})',
            PERSON,
        ) from None
    given = (("iss", person.iss), ("sub", person.sub), ("name", person.name))
    for field, text in [(f, t) for f, t in given if t is not None]:
        if not text or not _printable(text):
            raise CallerError(
                f"field {field} must be 1 to {MAX_NAME_CHARS} printable characters; got {text[:40]!r}", PERSON
            )
    return person if person.name is not None else msgspec.structs.replace(person, name=person.sub)


def encode_person(person: Person) -> str:
    """`Mesh-Person`'s value for a delegate's call (ASCII JSON: a NATS header value is text)."""
    fields = {"iss": person.iss, "sub": person.sub, "name": person.name or person.sub}
    return json.dumps(fields, separators=(",", ":"))


def local_caller(local: str | None) -> Caller:
    """The node's local identity: `[identity] local`, "account" or "account/user"; default the OS user."""
    text = local or os_user()
    account, _, user = text.partition("/")
    return Caller(account=account, user=user or None, name=None, via="local")


def os_user() -> str:
    """The name of the OS user running this process, or `uid-<n>` when it has none."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's numeric uid): still someone
        return f"uid-{os.getuid()}"


LOCAL_PERSON_VAR = "MESH_LOCAL_PERSON"  # every child's: the node's os_person().id


def os_person() -> Person:
    """The OS user running this process as a person, issued by this machine (`unix:<host>`): who a
    face over stdio, or a console's local login, passes; the node's own is an operator of its restarts."""
    user = os_user()
    return Person(iss=f"unix:{socket.gethostname()}", sub=user, name=user)


def check_local(local: str) -> str | None:
    """Why a configured local identity is unusable, or None."""
    account, _, user = local.partition("/")
    if not account or not _printable(local) or "/" in user or (local.endswith("/")):
        return f'{local!r} is not an identity; write "account" or "account/user", e.g. "ops/alice"'
    return None


def parse_listed(entry: str) -> tuple[str, str | None]:
    """A configured caller, "account/user" or "account" (checked by `check_local`), as (account, user)."""
    account, _, user = entry.partition("/")
    return account, user or None
