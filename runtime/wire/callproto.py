"""The bus call protocol's wire: header names, subjects, frames, and the checks of what a caller sends.

Shared by the node (runtime/calls/desk.py) and callers (runtime/client.py); docs/bus.md is the spec.
Pure: no I/O. Every header is hostile until checked here; a bad one is a 400 naming the header
and what would be right.
"""

from __future__ import annotations

import re
import secrets
from typing import Mapping

import msgspec

from runtime.wire.errors import BadRequest
from runtime.wire.identity import MAX_PERSON_BYTES, PERSON, REQUEST_INFO, CallerError, caller_from_info
from runtime.wire.subjects import CALLS_BUCKET

# --- request headers (caller -> node) --------------------------------------------------------
CALL_ID = "Mesh-Call-Id"  # names the call, so its caller can cancel it on mesh.cancel.<id>
TIMEOUT_MS = "Mesh-Timeout-Ms"  # the caller's deadline; shortens the bundle's timeout, never lengthens it
PROGRESS = "Mesh-Progress"  # "1": progress and keepalive frames on the reply subject
REQUEST_OBJECT = "Mesh-Request-Object"  # the arguments are in this object of the calls bucket
ANSWERS = "Mesh-Answers"  # "1": the caller answers a child's requests (ask frames, runtime/wire/asking.py)
DETACHED = "Mesh-Detached"  # "1": answered at once with a task; the call runs on without its caller
# PERSON (runtime/wire/identity.py): the person behind a delegate's call; read by the caller stamp.
KNOWN = (CALL_ID, TIMEOUT_MS, PROGRESS, REQUEST_OBJECT, ANSWERS, DETACHED, PERSON)


# --- reply headers (node -> caller) ---------------------------------------------------------
FRAME = "Mesh-Frame"  # on an interim message: "progress" or "keepalive"; a final reply has none
RESULT_OBJECT = "Mesh-Result-Object"  # the final result is in this object of the calls bucket
FRAME_PROGRESS = "progress"
FRAME_KEEPALIVE = "keepalive"

# A result object read through a node (any account may, for its own results): chunks, then a final reply.
FRAME_CHUNK = "chunk"
OBJECT_SIZE = "Mesh-Object-Size"
OBJECT_SHA256 = "Mesh-Object-Sha256"

DEFAULT_BUCKET = CALLS_BUCKET
REQUEST_OBJECT_PREFIX = "req."
RESULT_OBJECT_PREFIX = "res."

MAX_VALUE = 256  # bytes of one Mesh-* header value (Mesh-Person: MAX_PERSON_BYTES)
MAX_TIMEOUT_MS = 24 * 3600 * 1000
MAX_REASON = 200  # characters of a cancel's reason passed on to the child

_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
# W3C trace context: version 00, a 16-byte trace id and an 8-byte parent id (neither all zeros), flags.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_MS = re.compile(r"[0-9]{1,9}")
_OBJECT = re.compile(re.escape(REQUEST_OBJECT_PREFIX) + r"[A-Za-z0-9_-]{16,64}")
_RESULT = re.compile(re.escape("res.") + r"[A-Za-z0-9_-]{16,64}")
_PREFIX = "mesh-"
_KNOWN_LOWER = {k.lower(): k for k in KNOWN}


def new_traceparent() -> str:
    """A fresh W3C trace context for a call that starts a trace (sampled), as `runtime/client.py` sends it."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def valid_traceparent(text: str) -> bool:
    return _TRACEPARENT.fullmatch(text) is not None


def valid_call_id(text: str) -> bool:
    return _ID.fullmatch(text) is not None


def valid_result_name(text: str) -> bool:
    return _RESULT.fullmatch(text) is not None


class CallOptions(msgspec.Struct):
    """What a request's headers ask for; `account` is the caller's, None for the mesh account itself."""

    call_id: str | None = None
    timeout_ms: int | None = None
    progress: bool = False
    request_object: str | None = None
    account: str | None = None
    person: str | None = None  # Mesh-Person as sent; the caller stamp decides whether it is believed
    answers: bool = False  # Mesh-Answers: the caller answers ask frames
    detached: bool = False  # Mesh-Detached: a task, answered at once

    def timeout_for(self, bundle_timeout_ms: int) -> int:
        """The call's deadline: the caller's when it is shorter, else the bundle's cap."""
        if self.timeout_ms is None:
            return bundle_timeout_ms
        return min(self.timeout_ms, bundle_timeout_ms)


def request_account(headers: Mapping[str, str] | None) -> str | None:
    """The account a message came from, by the server's stamp; None: the mesh account itself.

    Raises ValueError when the stamp is there but is not what a server writes.
    """
    if not headers:
        return None
    info = headers.get(REQUEST_INFO)
    if info is None:
        return None
    try:
        return caller_from_info(info).account
    except CallerError as e:  # one reading of the stamp, the node's (runtime/wire/identity.py)
        raise ValueError(str(e)) from None


def parse_headers(subject: str, headers: Mapping[str, str], has_body: bool) -> CallOptions | None:
    """The options of a request, None when it carries no Mesh-* header; BadRequest when one is wrong."""
    found: dict[str, str] = {}
    for key, given in headers.items():
        low = key.lower()
        if not low.startswith(_PREFIX):
            continue
        name = _KNOWN_LOWER.get(low)
        if name is None:
            raise BadRequest(
                subject,
                f"unknown header {key[:64]!r}; the call protocol knows {', '.join(KNOWN)} (see docs/bus.md)",
                field=f"header {key[:64]}",
            )
        limit = MAX_PERSON_BYTES if name == PERSON else MAX_VALUE
        if len(given) > limit:
            raise BadRequest(subject, f"header {name} is {len(given)} bytes; at most {limit}", field=f"header {name}")
        found[name] = given.strip()
    if not found:
        return None
    opts = CallOptions()
    if (value := found.get(CALL_ID)) is not None:
        if not valid_call_id(value):
            raise BadRequest(
                subject,
                f"header {CALL_ID} must be 16 to 64 characters of A-Z a-z 0-9 _ - "
                "(a random id only the caller knows, e.g. 22 characters of a NUID)",
                field=f"header {CALL_ID}",
            )
        opts.call_id = value
    if (value := found.get(TIMEOUT_MS)) is not None:
        if not _MS.fullmatch(value) or not 1 <= int(value) <= MAX_TIMEOUT_MS:
            raise BadRequest(
                subject,
                f"header {TIMEOUT_MS} must be a whole number of milliseconds from 1 to "
                f"{MAX_TIMEOUT_MS}, e.g. 5000; got {value[:32]!r}",
                field=f"header {TIMEOUT_MS}",
            )
        opts.timeout_ms = int(value)
    if (value := found.get(PROGRESS)) is not None:
        if value != "1":
            raise BadRequest(
                subject,
                f"header {PROGRESS} must be 1 (progress and keepalive frames on the reply "
                f"subject) or left out; got {value[:32]!r}",
                field=f"header {PROGRESS}",
            )
        opts.progress = True
    if (value := found.get(REQUEST_OBJECT)) is not None:
        if not _OBJECT.fullmatch(value):
            raise BadRequest(
                subject,
                f"header {REQUEST_OBJECT} must name an object {REQUEST_OBJECT_PREFIX}<16 to 64 "
                f"of A-Z a-z 0-9 _ -> in bucket {DEFAULT_BUCKET}",
                field=f"header {REQUEST_OBJECT}",
            )
        if has_body:
            raise BadRequest(
                subject,
                f"a request with header {REQUEST_OBJECT} has an empty body: the arguments are in the object",
                field=f"header {REQUEST_OBJECT}",
            )
        opts.request_object = value
    for header in (ANSWERS, DETACHED):
        if (value := found.get(header)) is not None and value != "1":
            raise BadRequest(
                subject, f"header {header} must be 1 or left out; got {value[:32]!r}", field=f"header {header}"
            )
    opts.answers, opts.detached = ANSWERS in found, DETACHED in found
    for header, on, why in (
        (DETACHED, opts.detached, "it is the task's id"),
        (ANSWERS, opts.answers, "it names the answers"),
    ):
        if on and opts.call_id is None:
            raise BadRequest(subject, f"a call with {header}: 1 needs a {CALL_ID}: {why}", field=f"header {CALL_ID}")
    opts.person = found.get(PERSON)
    try:
        opts.account = request_account(headers)
    except ValueError as e:
        raise BadRequest(subject, str(e), field=f"header {REQUEST_INFO}") from None
    return opts


# --- frames ---------------------------------------------------------------------------------
class ProgressFrame(msgspec.Struct, omit_defaults=True):
    """The body of a progress frame; the same fields as MCP's notifications/progress, minus the token."""

    progress: int | float
    total: int | float | None = None
    message: str | None = None


class KeepaliveFrame(msgspec.Struct):
    """Sent when the node takes the call (elapsed 0) and after every `interval_ms` without a frame."""

    elapsed_ms: int
    interval_ms: int


class ObjectRef(msgspec.Struct):
    """Where a result (or request) larger than one message is: the body of a Mesh-Result-Object reply."""

    bucket: str
    name: str
    size: int
    sha256: str


class CancelBody(msgspec.Struct):
    reason: str | None = None


MAX_MESSAGE = 1024  # characters of a progress message passed on
