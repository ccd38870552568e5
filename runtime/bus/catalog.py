"""The catalogue's bucket on the bus: made, read whole, and where a connection is.

The bucket (`mesh-catalog`, runtime/wire/catalog.py) is one JetStream stream whose every write
the server also republishes on `mesh.catalog.<key>`, so a reader needs no consumer of its own:
it subscribes to those, then reads every current entry with batched direct gets (`scan`: one
request per 512 entries, to the end of the stream; the answer says when it is whole, so there
is no collection window). Both paths give an `Entry` with its stream sequence; a key's entry
with a higher sequence replaces a lower one, so the two paths' order does not matter
(runtime/bus/catalog_view.py, runtime/bus/catalog_watch.py).

The republished writes and this one stream's direct get API are all a caller account needs to
read the catalogue (runtime/bus/accounts.py exports them): read-only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable

from nats.aio.client import Client
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from runtime.wire.catalog import BUCKET_MAX_BYTES, MARKER_TTL_S, MAX_ENTRY_BYTES, STORED_PREFIX, STREAM
from runtime.wire.subjects import CATALOG_BUCKET, CATALOG_PREFIX

log = logging.getLogger("mesh.catalog")

SCAN_BATCH = 512  # entries per direct get request
SCAN_MAX_BYTES = 8 * 1024 * 1024  # bytes per direct get answer
SCAN_WAIT_S = 5.0  # the longest wait for the next message of an answer

_KV_OPERATION = "KV-Operation"
_MARKER_REASON = "Nats-Marker-Reason"


# --- where a connection is ------------------------------------------------------------------
@dataclass(frozen=True)
class Where:
    """The server a connection is on, from the server's INFO: its cluster, name and JetStream domain."""

    cluster: str
    server: str
    domain: str


def where(nc: Client) -> Where:
    info = getattr(nc, "_server_info", None) or {}  # nats-py keeps the server's INFO only here

    def text(name: str) -> str:
        value = info.get(name)
        return value[:256] if isinstance(value, str) else ""

    return Where(text("cluster"), text("server_name"), text("domain"))


# --- the bucket ---------------------------------------------------------------------------
class CatalogUnavailable(Exception):
    """The catalogue cannot be read or written here; the message says why and what would help."""


def bucket_config(replicas: int = 1, max_bytes: int = BUCKET_MAX_BYTES) -> api.KeyValueConfig:
    return api.KeyValueConfig(
        bucket=CATALOG_BUCKET,
        description="mesh: what every node serves (runtime/wire/catalog.py)",
        history=1,
        max_value_size=MAX_ENTRY_BYTES,
        max_bytes=max_bytes,
        storage=api.StorageType.FILE,
        replicas=replicas,
        republish=api.RePublish(src=STORED_PREFIX + ">", dest=CATALOG_PREFIX + ">"),
        direct=True,
        limit_marker_ttl=MARKER_TTL_S,
    )


async def open_bucket(js: JetStreamContext, replicas: int = 1, max_bytes: int = BUCKET_MAX_BYTES) -> None:
    """Make the bucket if it is not there, or put right what an older node made differently
    (republish, direct get, per-message TTL are what readers rely on)."""
    try:
        info = await js.stream_info(STREAM)
    except NotFoundError:
        info = None
    if info is None:
        try:
            await js.create_key_value(bucket_config(replicas, max_bytes))
            log.info("catalogue bucket %s made (%d replicas)", CATALOG_BUCKET, replicas)
            return
        except Exception as e:
            if "already in use" not in str(e).lower():
                raise CatalogUnavailable(_bucket_problem(e)) from None
            info = await js.stream_info(STREAM)  # another node made it first
    c = info.config
    want_republish = (STORED_PREFIX + ">", CATALOG_PREFIX + ">")
    have_republish = (c.republish.src, c.republish.dest) if c.republish else None
    if have_republish != want_republish or not c.allow_direct or not c.allow_msg_ttl or not c.subject_delete_marker_ttl:
        c.republish = api.RePublish(src=want_republish[0], dest=want_republish[1])
        c.allow_direct, c.allow_msg_ttl, c.subject_delete_marker_ttl = True, True, MARKER_TTL_S
        try:
            await js.update_stream(c)
        except Exception as e:
            raise CatalogUnavailable(_bucket_problem(e)) from None
        log.warning("catalogue bucket %s: its configuration was put right (republish, direct get, TTL)", CATALOG_BUCKET)


def _bucket_problem(e: BaseException) -> str:
    text = str(e)
    if "ttl" in text.lower() or "marker" in text.lower() or "KeyValueLimitMarkerTTLNotSupported" in type(e).__name__:
        return (
            f"the catalogue bucket {CATALOG_BUCKET} needs nats-server 2.11 or later (per-message TTL): "
            f"{type(e).__name__}: {text}"
        )
    return f"cannot make the catalogue bucket {CATALOG_BUCKET}: {type(e).__name__}: {text}"


# --- one entry, from either path ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    seq: int
    value: bytes | None  # None: deleted, purged or expired


def entry_of(subject: str, headers: dict[str, str] | None, data: bytes, prefix: str) -> Entry | str | None:
    """The entry a message carries (a scanned or republished one), why it is refused, or None
    when it is no entry at all. Its headers say where it was stored; those are checked too."""
    if not subject.startswith(prefix):
        return None
    key = subject[len(prefix) :]
    h = headers or {}
    if h.get("Nats-Stream") != STREAM:
        return f"{key[:80]}: not from stream {STREAM}"
    if h.get("Nats-Subject", STORED_PREFIX + key) != STORED_PREFIX + key:
        return f"{key[:80]}: stored under another subject"
    try:
        seq = int(h.get("Nats-Sequence", ""))
    except ValueError:
        return f"{key[:80]}: no stream sequence"
    if h.get(_KV_OPERATION) in ("DEL", "PURGE") or _MARKER_REASON in h:
        return Entry(key, seq, None)
    return Entry(key, seq, data)


async def scan(nc: Client, on_entry: Callable[[Entry | str], None], keys: str = ">") -> int:
    """Every current entry whose key matches `keys`, in stream order, each to `on_entry`; returns how many.

    Raises CatalogUnavailable when nobody answers (no bucket, no JetStream, or an account that
    does not import the catalogue)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    seq, count = 1, 0
    try:
        while True:
            ask = {"seq": seq, "next_by_subj": STORED_PREFIX + keys, "batch": SCAN_BATCH, "max_bytes": SCAN_MAX_BYTES}
            await nc.publish(f"$JS.API.DIRECT.GET.{STREAM}", json.dumps(ask).encode(), reply=inbox)
            last = 0
            while True:
                try:
                    msg = await sub.next_msg(timeout=SCAN_WAIT_S)
                except Exception:  # nats-py's TimeoutError: the stream's servers are away
                    raise CatalogUnavailable(
                        f"the catalogue bucket {CATALOG_BUCKET} did not answer within {SCAN_WAIT_S:g} s"
                    ) from None
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "204":  # the end of this batch: more to ask for, or the end
                    pending = int(headers.get("Nats-Num-Pending", "0") or 0)
                    if pending <= 0 or last == 0:
                        return count
                    seq = last + 1
                    break
                if status == "404":  # nothing (more) matches
                    return count
                if status is not None:
                    raise CatalogUnavailable(_unanswered(status, headers.get("Description", "")))
                got = entry_of(headers.get("Nats-Subject", ""), headers, msg.data, STORED_PREFIX)
                if got is None:
                    continue
                if isinstance(got, Entry):
                    last = got.seq
                on_entry(got)
                count += 1
    finally:
        try:
            await sub.unsubscribe()
        except Exception:  # the connection went away: the subscription went with it
            pass


def _unanswered(status: str, description: str) -> str:
    if status == "503":
        return (
            f"no catalogue on this bus: bucket {CATALOG_BUCKET} does not answer (no node of this version has "
            "started yet, JetStream is off, or this account does not import the catalogue: docs/scale.md)"
        )
    return f"the catalogue bucket {CATALOG_BUCKET} answered {status} {description}".rstrip()
