"""The seat lease's KV mechanics and one keeper, in this process against a real nats-server:
create-if-absent, renewal fenced by revision, release, expiry by the bucket's age, the home of
a disk-backed seat, a record that is not a node's, and a keeper losing its lease."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import AsyncIterator

import msgspec
import nats
import pytest
from nats.aio.client import Client

from runtime.seats.keeper import SeatKeeper
from runtime.wire.leases import LEASE_BUCKET, Found, Held, HomeRecord, LeaseLost, LeaseRecord, SeatLeases, seat_key
from tests.support.mesh import NatsServer


def record(node: str, run: str = "r1", service: str = "NOSUCHSERVICE") -> LeaseRecord:
    return LeaseRecord(node=node, module="store", service=service, run=run, since=time.time())


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Client]]:
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        yield server, nc
    finally:
        await nc.close()
        server.stop()


async def test_one_holder_out_of_twenty_at_the_same_instant(bus: tuple[NatsServer, Client]) -> None:
    server, _ = bus
    clients = [await nats.connect(server.url) for _ in range(20)]
    try:
        opened = await asyncio.gather(*(SeatLeases.open(nc, 5) for nc in clients))
        for round_ in range(5):
            got = await asyncio.gather(*(lv.acquire(f"s{round_}", record(f"n{i}")) for i, lv in enumerate(opened)))
            held = [g for g in got if isinstance(g, Held)]
            assert len(held) == 1
            holder = held[0].record.node
            assert all(isinstance(g, Found) and g.record.node == holder for g in got if not isinstance(g, Held))
    finally:
        for nc in clients:
            await nc.close()


async def test_renewal_is_fenced_by_revision(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 5)
    held = await leases.acquire("memory", record("a"))
    assert isinstance(held, Held)
    renewed = await leases.renew(held)
    assert renewed.revision > held.revision
    with pytest.raises(LeaseLost) as e:  # the old revision is stale: that holder's writes are fenced
        await leases.renew(held)
    assert e.value.now is not None and e.value.now.node == "a"
    # Another writer came between: the holder learns it has lost, and to whom.
    await leases.leases.put(seat_key("memory"), msgspec.json.encode(record("b")))
    with pytest.raises(LeaseLost) as e:
        await leases.renew(renewed)
    assert e.value.now is not None and e.value.now.node == "b" and "node b holds it now" in str(e.value)


async def test_release_frees_the_seat_and_a_stale_release_does_nothing(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 5)
    a = await leases.acquire("memory", record("a"))
    assert isinstance(a, Held)
    await leases.release(a)
    assert await leases.read("memory") is None
    b = await leases.acquire("memory", record("b"))
    assert isinstance(b, Held)
    assert await leases.release(a) is False  # a's revision is stale: b's lease stands
    found = await leases.read("memory")
    assert found is not None and found.record.node == "b"


async def test_a_lease_not_renewed_expires_with_the_buckets_age(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 1)
    assert leases.ttl_s == 1
    assert isinstance(await leases.acquire("memory", record("a")), Held)
    assert isinstance(await leases.acquire("memory", record("b")), Found)
    deadline = time.monotonic() + 10
    while isinstance(got := await leases.acquire("memory", record("b")), Found):
        assert time.monotonic() < deadline, "the lease never expired"
        await asyncio.sleep(0.1)
    assert got.record.node == "b"


async def test_a_node_takes_back_its_own_lease_and_fences_its_old_run(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 5)
    old = await leases.acquire("memory", record("a", run="old"))
    new = await leases.acquire("memory", record("a", run="new"))
    assert isinstance(old, Held) and isinstance(new, Held) and new.revision > old.revision
    with pytest.raises(LeaseLost):
        await leases.renew(old)


async def test_another_ttl_in_config_uses_the_buckets(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    await SeatLeases.open(nc, 7)
    assert (await SeatLeases.open(nc, 30)).ttl_s == 7


async def test_the_first_holder_is_the_home_and_stays_it(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 5)
    first = await leases.settle_home("memory", HomeRecord("a", "store", time.time()))
    again = await leases.settle_home("memory", HomeRecord("b", "store", time.time()))
    assert first.node == again.node == "a"


async def test_a_record_that_is_not_a_nodes_is_never_taken_over(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 5)
    await leases.leases.put(seat_key("memory"), b"garbage {")
    got = await leases.acquire("memory", record("a"))
    assert isinstance(got, Found) and got.record.node == "?"


async def test_keeper_loses_at_once_and_answers_503_naming_the_new_holder(
    bus: tuple[NatsServer, Client], caplog
) -> None:
    _, nc = bus
    leases = await SeatLeases.open(nc, 3)
    changes: list[str] = []

    async def changed(k: SeatKeeper) -> None:
        changes.append(k.state)

    keeper = SeatKeeper(
        nc,
        leases,
        seat="memory",
        module="store",
        node="a",
        service_id="S1",
        run_id="r",
        failover="local",
        subjects=["mesh.seat.memory.>", "mesh.tool.store.>"],
        queue_group="mesh",
        on_change=changed,
    )
    await keeper.look()
    assert keeper.state == "held" and changes == ["held"]
    # An intruder overwrites the lease: the next renewal finds it out; the keeper stops serving.
    await leases.leases.put(seat_key("memory"), msgspec.json.encode(record("intruder")))
    with caplog.at_level(logging.ERROR, logger="mesh.seats"):
        await keeper.look()
    assert keeper.state == "elsewhere" and keeper.holder == "intruder" and keeper.silent
    assert changes[-1] == "elsewhere" and "held" not in changes[1:]
    assert any(
        "lease of seat memory" in r.message and "node intruder holds it now" in r.message for r in caplog.records
    )
    # The intruder answers no ping: this node answers the seat's subjects 503, naming it.
    msg = await nc.request("mesh.seat.memory.recall", b"{}", timeout=5)
    assert (msg.headers or {}).get("Nats-Service-Error-Code") == "503"
    body = json.loads(msg.data)["error"]
    assert body["kind"] == "seat_unavailable" and body["seat"] == "memory" and body["holder"] == "intruder"
    assert any("start node intruder again" in w for w in body["ways_out"])
    msg = await nc.request("mesh.tool.store.export", b"{}", timeout=5)
    assert (msg.headers or {}).get("Nats-Service-Error-Code") == "503"
    await keeper.close()
    found = await leases.read("memory")
    assert found is not None and found.record.node == "intruder"  # not ours: not released


async def test_bucket_name_is_the_documented_one(bus: tuple[NatsServer, Client]) -> None:
    _, nc = bus
    await SeatLeases.open(nc, 5)
    assert (await nc.jetstream().key_value(LEASE_BUCKET)) is not None
