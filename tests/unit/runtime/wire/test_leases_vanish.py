"""A lease that expires at the instant another node creates it: nats-py's `create` (write if
absent, else look again) then finds no key at all and raises KeyNotFoundError. The seat is free:
`acquire` takes it, as it does when the lease vanishes between its own create and read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError

from runtime.wire.leases import Held, LeaseRecord, SeatLeases
from tests.support.mesh import NatsServer


class VanishingOnce:
    """A KV bucket whose first `create` fails as nats-py's does when the key expired meanwhile."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.vanished = kv, False

    async def create(self, key: str, value: bytes) -> int:
        if not self.vanished:
            self.vanished = True
            raise KeyNotFoundError
        return int(await self.kv.create(key, value))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


@pytest.fixture
async def nc(tmp_path: Path) -> AsyncIterator[Client]:
    server = NatsServer(tmp_path / "nats").start()
    client = await nats.connect(server.url)
    try:
        yield client
    finally:
        await client.close()
        server.stop()


async def test_a_lease_gone_as_it_is_created_is_taken(nc: Client) -> None:
    opened = await SeatLeases.open(nc, 5)
    leases = SeatLeases(VanishingOnce(opened.leases), opened.homes, opened.ttl_s)  # type: ignore[arg-type]
    got = await leases.acquire("memory", LeaseRecord(node="b", module="store", service="S", run="r", since=time.time()))
    assert isinstance(got, Held) and got.record.node == "b"
    found = await opened.read("memory")
    assert found is not None and found.record.node == "b"
