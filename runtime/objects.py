"""Results and requests larger than one bus message, handed over through a JetStream object store.

One bucket (`mesh-calls` unless configured) whose stream's max age is the objects' TTL: nothing
has to remember to delete a result a caller never fetched. Names are `res.<random>` for results
(only the caller that gets the reply learns the name) and `req.<random>` for requests. The node
reads a request object once and deletes it; a result object lives until its TTL.
"""

from __future__ import annotations

import hashlib
import io
import logging
import secrets

import msgspec
from nats.aio.client import Client
from nats.js import api
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from .callproto import DEFAULT_BUCKET, REQUEST_OBJECT_PREFIX, RESULT_OBJECT, RESULT_OBJECT_PREFIX, ObjectRef
from .errors import OverCap

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

    async def park(self, subject: str, what: str, data: bytes) -> tuple[bytes, dict[str, str]]:
        """Store a result; the reply's body and headers that point at it."""
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
        await store.put(name, data)
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


async def put_request(nc: Client, data: bytes, bucket: str = DEFAULT_BUCKET) -> str:
    """The caller's side: put a request's arguments into the bucket; the name for Mesh-Request-Object."""
    store = await open_bucket(nc, bucket, DEFAULT_TTL_S, set_ttl=False)
    name = object_name(REQUEST_OBJECT_PREFIX)
    await store.put(name, data)
    return name


class ObjectMismatch(Exception):
    pass


async def fetch_result(nc: Client, ref: ObjectRef, cap: int = DEFAULT_CAP) -> bytes:
    """The caller's side: a result object's bytes, checked against the reply's size and sha256."""
    if ref.size > cap:
        raise ObjectMismatch(f"result object {ref.name} is {ref.size} bytes; this caller takes at most {cap}")
    store = await nc.jetstream().object_store(ref.bucket)
    sink = io.BytesIO()
    await store.get(ref.name, writeinto=sink)
    data = sink.getvalue()
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise ObjectMismatch(f"result object {ref.name} is not what the reply says (size or sha256 differ)")
    return data
