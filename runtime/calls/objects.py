"""Results and requests larger than one bus message, handed over through a JetStream object store.

One bucket (`mesh-calls` unless configured) whose stream's max age is the objects' TTL: nothing
has to remember to delete a result a caller never fetched. Names are `res.<random>` for results
(only the caller that gets the reply learns the name) and `req.<random>` for requests. The node
reads a request object once and deletes it; a result object lives until its TTL.

A result is read back through a node (`mesh.fetch.<name>`, chunks on the reply subject), so a
caller needs no JetStream permission and one in another account reads it through its imports;
the node hands a result only to the account whose call made it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import secrets

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from runtime.wire.callproto import (
    DEFAULT_BUCKET,
    FRAME,
    FRAME_CHUNK,
    OBJECT_SHA256,
    OBJECT_SIZE,
    REQUEST_OBJECT_PREFIX,
    RESULT_OBJECT,
    RESULT_OBJECT_PREFIX,
    ObjectRef,
    request_account,
    valid_result_name,
)
from runtime.wire.errors import NodeError, NoSuchObject, OverCap, render
from runtime.wire.subjects import FETCH_PREFIX

log = logging.getLogger("mesh.objects")

DEFAULT_TTL_S = 600.0
DEFAULT_CAP = 64 * 1024 * 1024

_encode = msgspec.json.Encoder().encode


def object_name(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(16)  # 22 characters of A-Z a-z 0-9 _ -


async def open_bucket(nc: Client, bucket: str, ttl_s: float, *, set_ttl: bool) -> ObjectStore:
    """The bucket, made when missing; `set_ttl` (the node) also brings its TTL to `ttl_s`."""
    js = nc.jetstream()
    try:
        store = await js.object_store(bucket)
    except BucketNotFoundError:
        return await js.create_object_store(
            bucket,
            config=api.ObjectStoreConfig(
                ttl=ttl_s, description="mesh call results and requests larger than one message"
            ),
        )
    if set_ttl:
        stream = f"OBJ_{bucket}"
        info = await js.stream_info(stream)
        if info.config.max_age is None or abs(info.config.max_age - ttl_s) > 0.001:
            info.config.max_age = ttl_s
            await js.update_stream(info.config)
            log.info("object store %s: TTL set to %g s", bucket, ttl_s)
    return store


class ObjectHandoff:
    """The node's side: park a large result, take a large request; the bucket opened at first use."""

    def __init__(
        self, nc: Client, bucket: str = DEFAULT_BUCKET, ttl_s: float = DEFAULT_TTL_S, cap: int = DEFAULT_CAP
    ) -> None:
        self.nc, self.bucket, self.ttl_s, self.cap = nc, bucket, ttl_s, cap
        self._store: ObjectStore | None = None

    async def _open(self, subject: str, what: str, size: int) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await open_bucket(self.nc, self.bucket, self.ttl_s, set_ttl=True)
            except Exception as e:  # no JetStream, no permission: the caller learns why in the 413
                raise OverCap(
                    subject,
                    what,
                    size,
                    self.cap,
                    f"larger than one bus message, and the object store {self.bucket} for larger "
                    f"ones is not usable: {type(e).__name__}: {e}",
                ) from None
        return self._store

    async def park(self, subject: str, what: str, data: bytes, account: str | None) -> tuple[bytes, dict[str, str]]:
        """Store a result for `account` (None: the mesh account); the reply's body and headers that point at it."""
        if len(data) > self.cap:
            raise OverCap(
                subject,
                what,
                len(data),
                self.cap,
                f"the cap for results handed over through the object store is {self.cap} bytes",
            )
        store = await self._open(subject, what, len(data))
        name = object_name(RESULT_OBJECT_PREFIX)
        await store.put(name, data, meta=api.ObjectMeta(name=name, description=_owner(account)))
        ref = ObjectRef(bucket=self.bucket, name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        return _encode(ref), {RESULT_OBJECT: name}

    async def take(self, subject: str, name: str) -> bytes:
        """Read a request object once (then it is deleted); OverCap past the cap."""
        store = await self._open(subject, "the request object", 0)
        try:
            info = await store.get_info(name)
        except NotFoundError:
            raise OverCap(
                subject,
                f"request object {name}",
                0,
                self.cap,
                f"no such object in bucket {self.bucket} (expired after {self.ttl_s:g} s, or never put)",
            ) from None
        if (info.size or 0) > self.cap:
            raise OverCap(
                subject,
                f"request object {name}",
                info.size or 0,
                self.cap,
                f"the cap for requests handed over through the object store is {self.cap} bytes",
            )
        sink = io.BytesIO()
        await store.get(name, writeinto=sink)
        try:
            await store.delete(name)
        except Exception as e:  # it expires with its TTL anyway
            log.warning("could not delete request object %s: %s", name, e)
        return sink.getvalue()

    async def serve_fetch(self, msg: Msg) -> None:
        """`mesh.fetch.<name>`: the result object in chunks on the reply subject, then a final reply
        with its size and sha256; 404 for an object that is not there or not the asker's."""
        if not msg.reply:
            return
        name = msg.subject[len(FETCH_PREFIX) :]
        try:
            for chunk, headers in await self._chunks(msg, name):
                await self.nc.publish(msg.reply, chunk, headers=headers)
        except NodeError as e:
            body, headers = render(e)
            await self.nc.publish(msg.reply, body, headers=headers)
        except Exception as e:  # the bus or the store failed mid-way: the caller's wait ends with its timeout
            log.warning("could not hand over %s: %s", name, e)

    async def _chunks(self, msg: Msg, name: str) -> list[tuple[bytes, dict[str, str]]]:
        missing = NoSuchObject(msg.subject, name, self.bucket, self.ttl_s)
        if not valid_result_name(name):
            raise missing
        try:
            account = request_account(msg.headers)
        except ValueError:
            raise missing from None
        store = await self._open(msg.subject, f"result object {name}", 0)
        try:
            info = await store.get_info(name)
        except NotFoundError:
            raise missing from None
        if info.description != _owner(account):
            raise missing  # another account's result: not even said to exist
        sink = io.BytesIO()
        await store.get(name, writeinto=sink)
        data = sink.getvalue()
        step = max(1024, (self.nc.max_payload or 1024 * 1024) - 4096)
        frames = [(data[i : i + step], {FRAME: FRAME_CHUNK}) for i in range(0, len(data), step)]
        done = {OBJECT_SIZE: str(len(data)), OBJECT_SHA256: hashlib.sha256(data).hexdigest()}
        return [*frames, (b"", done)]


def _owner(account: str | None) -> str:
    """What a result object records of the account it was made for (the mesh account: empty)."""
    return f"mesh-caller-account:{account or ''}"


async def put_request(nc: Client, data: bytes, bucket: str = DEFAULT_BUCKET) -> str:
    """The caller's side: put a request's arguments into the bucket; the name for Mesh-Request-Object."""
    store = await open_bucket(nc, bucket, DEFAULT_TTL_S, set_ttl=False)
    name = object_name(REQUEST_OBJECT_PREFIX)
    await store.put(name, data)
    return name
