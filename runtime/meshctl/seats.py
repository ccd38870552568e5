"""The operator's seat verbs: which node holds each stateful seat and where its data lives, and
`adopt`: the operator's word that a node holds a disk-backed seat's data now.

A node never moves a seat's home by itself (that would be a silent takeover with an empty
store); only these verbs do, and they say what they did.
"""

from __future__ import annotations

import time

import anyio
import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from runtime.meshctl.errors import Refused
from runtime.wire.control import SeatMoveAsk, SeatMoveReply
from runtime.wire.leases import NEWEST, HomeRecord, LeaseRecord, SeatLeases
from runtime.wire.subjects import SEAT_MOVE, node_subject


class SeatRow(msgspec.Struct):
    seat: str
    holder: str  # node holding the lease now, "" when free
    module: str
    since: float
    home: str  # node whose disk holds the data, "" when none is recorded
    home_how: str
    store: str = ""  # the store id (runtime/seats/store.py)
    replica: str = ""  # a replicated seat: its current generation's bucket prefix
    last_sync: float = 0.0  # when its replica last took a write, as the holder saw at its last renewal
    lag_s: float = 0.0  # how far the holder's database was ahead of the replica then


class SeatAdminError(Refused):
    """A seat verb the mesh refuses (exit 1)."""


async def open_leases(nc: Client) -> SeatLeases:
    # Reading does not decide the lease's life: the bucket's age, when it exists, is used.
    return await SeatLeases.open(nc, 10.0)


async def seat_rows(nc: Client) -> list[SeatRow]:
    leases = await open_leases(nc)
    rows = []
    for seat in await leases.seats():
        lease, home = await leases.read(seat), await leases.home(seat)
        held = lease.record if lease is not None and isinstance(lease.record, LeaseRecord) else None
        where = home.record if home is not None and isinstance(home.record, HomeRecord) else None
        rows.append(
            SeatRow(
                seat=seat,
                holder=held.node if held else "",
                module=held.module if held else (where.module if where else ""),
                since=held.since if held else 0.0,
                home=where.node if where else "",
                home_how=where.how if where else "",
                store=where.store if where else "",
                replica=where.replica if where else "",
                last_sync=held.synced if held else 0.0,
                lag_s=held.lag_s if held else 0.0,
            )
        )
    return rows


async def adopt(nc: Client, seat: str, node: str) -> tuple[HomeRecord, str]:
    """Make `node` the home of `seat`'s data; (new home, what it was). Refused while another node holds it."""
    leases = await open_leases(nc)
    lease = await leases.read(seat)
    if lease is not None and isinstance(lease.record, LeaseRecord) and lease.record.node != node:
        raise SeatAdminError(
            f"node {lease.record.node} holds seat {seat} now (module {lease.record.module}); stop it first, "
            f"or move the data with `meshctl seat move {seat} --to {node}`"
        )
    home = await leases.home(seat)
    before = home.record.node if home is not None and isinstance(home.record, HomeRecord) else ""
    module = home.record.module if home is not None and isinstance(home.record, HomeRecord) else "?"
    record = HomeRecord(
        node=node, module=module, since=time.time(), how=f"adopted by an operator (was {before or 'none'})"
    )
    try:
        await leases.set_home(seat, record, home.revision if home is not None else None)
    except Exception as e:
        raise SeatAdminError(
            f"the home of seat {seat} changed while adopting it ({e}); look again with `meshctl seat list`"
        ) from e
    return record, before


async def move(nc: Client, seat: str, to: str, timeout: float) -> tuple[SeatMoveReply, bool]:
    """Ask the seat's home node to hand its data to `to`, then wait (at most `timeout`) until `to` holds it.

    (the home's answer, whether `to` holds the seat by the end)."""
    leases = await open_leases(nc)
    home = await leases.home(seat)
    if home is None or not isinstance(home.record, HomeRecord):
        raise SeatAdminError(
            f"seat {seat} has no recorded data home: it is replicated, stateless or never held; see `meshctl seat list`"
        )
    source = home.record.node
    if source == to:
        raise SeatAdminError(f"seat {seat}'s data is on node {to} already")
    try:
        msg = await nc.request(
            node_subject(source, SEAT_MOVE), msgspec.json.encode(SeatMoveAsk(seat=seat, to=to)), timeout=timeout
        )
    except NoRespondersError:
        raise SeatAdminError(
            f"node {source} holds seat {seat}'s data and does not run; its data moves only from a running node: "
            f"start node {source} and move again, or, if its data is gone for good, "
            f"`meshctl seat adopt {seat} --node {to}`"
        ) from None
    except NatsTimeout:
        raise SeatAdminError(f"node {source} did not answer the move within {timeout:g} s; see its log") from None
    reply = msgspec.json.decode(msg.data, type=SeatMoveReply)
    if not reply.ok:
        raise SeatAdminError(reply.error)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = await leases.read(seat)
        if lease is not None and isinstance(lease.record, LeaseRecord) and lease.record.node == to:
            return reply, True
        await anyio.sleep(0.2)
    return reply, False


async def restore(nc: Client, seat: str, node: str, at: str) -> HomeRecord:
    """Name `node` to restore a replicated seat's store (at `at`, Litestream's -timestamp, or the newest)
    and hold it. Refused while a node holds the seat: it is stopped first, so nothing is written meanwhile."""
    leases = await open_leases(nc)
    lease = await leases.read(seat)
    if lease is not None and isinstance(lease.record, LeaseRecord):
        raise SeatAdminError(
            f"node {lease.record.node} holds seat {seat} now; stop it (or its module) first, then restore: "
            "a restore under a live holder would lose the writes it answers meanwhile"
        )
    home = await leases.home(seat)
    if home is None or not isinstance(home.record, HomeRecord) or not home.record.replica:
        raise SeatAdminError(
            f"seat {seat} has no replica to restore from (not replicated, or never held); "
            f"`meshctl seat adopt {seat} --node {node}` starts an empty store there on purpose"
        )
    record = msgspec.structs.replace(
        home.record, node=node, how=f"restore{' at ' + at if at else ''} asked by an operator", restore_at=at or NEWEST
    )
    try:
        await leases.set_home(seat, record, home.revision)
    except Exception as e:
        raise SeatAdminError(
            f"the home of seat {seat} changed meanwhile ({e}); look again with `meshctl seat list`"
        ) from e
    return record
