"""Seat leases in JetStream KV: one holder of a stateful seat in the whole mesh.

Two buckets:
- `mesh-seat-leases`, whose max age is the lease's time to live: key `seat.<seat>` names the
  live holder. Created only if absent; renewed by an update fenced by the revision the holder
  last wrote (a holder whose revision is stale has lost the seat); deleted on a clean stop;
  gone by itself when the holder dies and stops renewing.
- `mesh-seat-homes`, without age: key `seat.<seat>` names the node whose disk holds a seat's
  data (a seat that does not fail over by itself). Written by the first holder; changed only by
  an operator (`meshctl seat adopt` / `meshctl seat move`), never by a node taking a free lease.

This module is the KV mechanics only; runtime/seats/keeper.py decides what a node does with them.
"""

from __future__ import annotations

import time

import msgspec
from nats.aio.client import Client
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

LEASE_BUCKET = "mesh-seat-leases"
HOME_BUCKET = "mesh-seat-homes"
# A lease record is small; a bigger value is not ours and is read as garbage, not trusted.
MAX_RECORD_BYTES = 4096
NEWEST = "newest"  # HomeRecord.restore_at: the newest point of the replica, restored by the node named


class LeaseRecord(msgspec.Struct, frozen=True):
    node: str
    module: str
    service: str  # the holder's Service API id: whether it lives is one $SRV.PING away
    run: str  # the holding process's run id: a restarted node is another process
    since: float  # unix time the hold began
    # A replicated seat: when its replica last took a write (unix time, 0: never), and how far the
    # holder's database is ahead of it (seconds), as the holder saw at its last renewal.
    synced: float = 0.0
    lag_s: float = 0.0


class HomeRecord(msgspec.Struct, frozen=True):
    node: str
    module: str
    since: float
    how: str = "first holder"  # or what the operator did: adopted, moved
    data: str = ""  # a moved seat: the object in `mesh-seat-data` holding its data
    sha256: str = ""  # of that object
    # The store's identity (runtime/seats/store.py): a random id, the node that made it, when. A node
    # serves the seat only from a folder (or a replica) carrying this id.
    store: str = ""
    store_node: str = ""
    store_since: float = 0.0
    # A replicated seat (runtime/seats/replica.py): the current generation's bucket prefix (one
    # bucket a database: `<replica>-<i>`), and whether its last holder stopped cleanly (its
    # replica then holds every answered write: no ids to skip).
    replica: str = ""
    clean: bool = False
    restore_at: str = ""  # `meshctl seat restore --at`: the point in time the named node restores


class Held(msgspec.Struct, frozen=True):
    """A lease as its holder knows it: the revision it last wrote fences every later write."""

    seat: str
    revision: int
    record: LeaseRecord


class Found(msgspec.Struct, frozen=True):
    """A record read from a bucket with the revision it was read at."""

    revision: int
    record: LeaseRecord | HomeRecord


class LeaseLost(Exception):
    """The lease was taken over, expired or deleted since this holder last wrote it."""

    def __init__(self, seat: str, revision: int, now: LeaseRecord | None) -> None:
        self.seat, self.revision, self.now = seat, revision, now
        holder = f"node {now.node} holds it now" if now else "nobody holds it now (it expired or was deleted)"
        super().__init__(f"lease of seat {seat} (revision {revision}) is lost: {holder}")


def seat_key(seat: str) -> str:
    return f"seat.{seat}"


def _is_wrong_sequence(e: Exception) -> bool:
    return isinstance(e, KeyWrongLastSequenceError) or "wrong last sequence" in str(e).lower()


async def _bucket(nc: Client, name: str, ttl: float | None, replicas: int = 1) -> KeyValue:
    js = nc.jetstream()
    try:
        return await js.key_value(name)
    except (BucketNotFoundError, NotFoundError):
        pass
    try:
        return await js.create_key_value(bucket=name, history=1, ttl=ttl, replicas=replicas)
    except BadRequestError as e:
        if replicas > 1 and "replicas" in str(e).lower():  # a lone server (or too few): one replica
            return await _bucket(nc, name, ttl, 1)
        # Another node made it at the same instant, perhaps with another TTL: use theirs.
        return await js.key_value(name)
    except Exception as e:
        if replicas > 1 and ("replicas" in str(e).lower() or "insufficient" in str(e).lower()):
            return await _bucket(nc, name, ttl, 1)
        raise


class SeatLeases:
    """The two buckets, opened (or made) once per node."""

    def __init__(self, leases: KeyValue, homes: KeyValue, ttl_s: float) -> None:
        self.leases, self.homes, self.ttl_s = leases, homes, ttl_s

    @classmethod
    async def open(cls, nc: Client, ttl_s: float, replicas: int = 1) -> SeatLeases:
        """`replicas`: of the buckets when this node makes them (a cluster keeps its seats when a server dies)."""
        leases = await _bucket(nc, LEASE_BUCKET, ttl_s, replicas)
        homes = await _bucket(nc, HOME_BUCKET, None, replicas)
        status = await leases.status()
        # The bucket's age is the lease's life, whatever this node's config says.
        return cls(leases, homes, float(status.ttl or ttl_s))

    # --- leases -------------------------------------------------------------------------
    async def read(self, seat: str) -> Found | None:
        return await _read(self.leases, seat, LeaseRecord)

    async def acquire(self, seat: str, record: LeaseRecord) -> Held | Found:
        """Create the lease if nobody holds it (or take back this node's own): Held, or the holder."""
        data = msgspec.json.encode(record)
        try:
            return Held(seat, await self.leases.create(seat_key(seat), data), record)
        except KeyNotFoundError:  # nats-py's create looked again and found no key: it expired meanwhile, free
            return await self.acquire_once_more(seat, record)
        except Exception as e:  # nats-py raises a few types for "exists"; anything else is a bus error
            if not _is_wrong_sequence(e) and "key exists" not in str(e).lower():
                raise
        found = await self.read(seat)
        if found is None:
            return await self.acquire_once_more(seat, record)
        current = found.record
        assert isinstance(current, LeaseRecord)
        if current.node != record.node:
            return found
        # This node's own lease from a run that ended (a crash, a restart): its data is here,
        # so it is taken back, fenced by the revision read, so the old run cannot write again.
        try:
            return Held(seat, await self.leases.update(seat_key(seat), data, last=found.revision), record)
        except Exception as e:
            if _is_wrong_sequence(e):
                return await self.read(seat) or found
            raise

    async def acquire_once_more(self, seat: str, record: LeaseRecord) -> Held | Found:
        # The lease vanished between create and read (it expired): one more create decides.
        data = msgspec.json.encode(record)
        try:
            return Held(seat, await self.leases.create(seat_key(seat), data), record)
        except Exception as e:
            if not _is_wrong_sequence(e):
                raise
            found = await self.read(seat)
            if found is None:
                raise LeaseLost(seat, 0, None) from None
            return found

    async def renew(self, held: Held) -> Held:
        """Write the lease again (its age starts over); LeaseLost when another write came between."""
        try:
            revision = await self.leases.update(
                seat_key(held.seat), msgspec.json.encode(held.record), last=held.revision
            )
        except Exception as e:
            if not _is_wrong_sequence(e):
                raise
            found = await self.read(held.seat)
            now = found.record if found is not None and isinstance(found.record, LeaseRecord) else None
            raise LeaseLost(held.seat, held.revision, now) from None
        return Held(held.seat, revision, held.record)

    async def release(self, held: Held) -> bool:
        """Delete the lease if it is still this holder's (the revision says so); False when it was not."""
        try:
            await self.leases.delete(seat_key(held.seat), last=held.revision)
        except Exception as e:
            if _is_wrong_sequence(e):
                return False
            raise
        return True

    # --- homes --------------------------------------------------------------------------
    async def home(self, seat: str) -> Found | None:
        return await _read(self.homes, seat, HomeRecord)

    async def settle_home(self, seat: str, record: HomeRecord) -> HomeRecord:
        """The seat's home: this record when it had none, else the one already written."""
        for _ in range(3):  # a home deleted between the create and the read: create again
            try:
                await self.homes.create(seat_key(seat), msgspec.json.encode(record))
                return record
            except Exception as e:
                if not _is_wrong_sequence(e):
                    raise
            found = await self.home(seat)
            if found is not None:
                assert isinstance(found.record, HomeRecord)
                return found.record
        raise LeaseLost(seat, 0, None)

    async def set_home(self, seat: str, record: HomeRecord, last: int | None) -> int:
        """An operator's word on where the data lives; `last` fences it against a concurrent change."""
        data = msgspec.json.encode(record)
        if last is None:
            return await self.homes.create(seat_key(seat), data)
        return await self.homes.update(seat_key(seat), data, last=last)

    async def seats(self) -> list[str]:
        """Every seat with a lease or a home."""
        names: set[str] = set()
        for bucket in (self.leases, self.homes):
            try:
                keys = await bucket.keys()
            except Exception as e:  # nats-py says "no keys" with an exception
                if "no keys" in str(e).lower():
                    continue
                raise
            names.update(k[len("seat.") :] for k in keys if k.startswith("seat."))
        return sorted(names)


async def _read(bucket: KeyValue, seat: str, kind: type[LeaseRecord] | type[HomeRecord]) -> Found | None:
    try:
        entry = await bucket.get(seat_key(seat))
    except (KeyNotFoundError, NotFoundError):  # absent, deleted or purged: nobody
        return None
    if entry.value is None or entry.revision is None:
        return None
    if len(entry.value) > MAX_RECORD_BYTES:
        record = kind(node="?", module="?", **_unreadable(kind))  # type: ignore[arg-type]
        return Found(entry.revision, record)
    try:
        return Found(entry.revision, msgspec.json.decode(entry.value, type=kind))
    except (msgspec.DecodeError, msgspec.ValidationError):
        # Not written by a node: it still occupies the key; say so rather than take the seat.
        return Found(entry.revision, kind(node="?", module="?", **_unreadable(kind)))  # type: ignore[arg-type]


def _unreadable(kind: type[LeaseRecord] | type[HomeRecord]) -> dict[str, object]:
    if kind is LeaseRecord:
        return {"service": "", "run": "", "since": 0.0}
    return {"since": 0.0, "how": "unreadable record"}


def now() -> float:
    return time.time()
