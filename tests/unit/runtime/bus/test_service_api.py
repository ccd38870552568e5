"""The Service API's groups on a real bus, in-process: each group's requests on a lane of its own
(issue 30 item 2), and what a lane has read and the node cannot queue answered 503, not dropped."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from runtime.bus import service_api
from runtime.bus.connect import connect_lane
from runtime.bus.service_api import ServiceApi
from runtime.config import NatsConfig
from runtime.wire.errors import HEADER_CODE
from tests.support.mesh import NatsServer


class Replier:
    """A stand-in for the dispatcher: takes each request in the callback, answers it on the node's connection."""

    def __init__(self, nc: Client, hold_s: float = 0.0) -> None:
        self.nc, self.hold_s = nc, hold_s
        self.taken: list[Msg] = []
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()

    def take(self, msg: Msg) -> None:
        if self.hold_s:
            time.sleep(self.hold_s)  # the node's loop busy elsewhere: the lane's reads pile up meanwhile
        self.taken.append(msg)
        self._queue.put_nowait(msg)

    async def run(self) -> None:
        while True:
            msg = await self._queue.get()
            await self.nc.publish(msg.reply, b"taken " + msg.subject.encode())


@pytest.fixture
async def node_side(nats_server: NatsServer) -> AsyncIterator[Callable[..., Awaitable[tuple[ServiceApi, Replier]]]]:
    made: list[tuple[ServiceApi, Client, asyncio.Task[None]]] = []
    cfg = msgspec.structs.replace(NatsConfig(), url=nats_server.url)

    async def make(hold_s: float = 0.0, lanes: bool = True) -> tuple[ServiceApi, Replier]:
        nc = await nats.connect(nats_server.url, name="mesh-node:t")
        replier = Replier(nc, hold_s)

        async def lane(subject: str, on_error: Callable[[Exception], Awaitable[None]]) -> Client:
            return await connect_lane(cfg, f"mesh-node:t:{subject}", on_error)

        service = ServiceApi(
            nc,
            node="t",
            queue_group="mesh",
            handler=replier.take,
            endpoints=list,
            metadata=dict,
            lane=lane if lanes else None,
        )
        made.append((service, nc, asyncio.get_running_loop().create_task(replier.run())))
        return service, replier

    yield make
    for service, nc, task in made:
        task.cancel()
        await service.drain()
        await service.stop()
        await nc.close()


async def test_each_group_takes_its_requests_on_a_lane_of_its_own(nats_server: NatsServer, node_side: Any) -> None:
    service, replier = await node_side()
    await service.serve("mesh.tool.a.>")
    await service.serve("mesh.tool.b.>")
    await service.serve("mesh.tool.a.>")  # served already: nothing new
    lanes = service.lanes()
    assert set(lanes) == {"mesh.tool.a.>", "mesh.tool.b.>"}
    assert len({lanes["mesh.tool.a.>"], lanes["mesh.tool.b.>"], service.nc.client_id}) == 3, lanes
    caller = await nats.connect(nats_server.url)
    for subject in ("mesh.tool.a.x", "mesh.tool.b.y"):
        reply = await caller.request(subject, b"{}", timeout=5)
        assert reply.data == b"taken " + subject.encode()
    # Each arrived on its own lane; the answers went on the node's connection.
    assert {m._client.client_id for m in replier.taken} == {lanes["mesh.tool.a.>"], lanes["mesh.tool.b.>"]}
    lane_a = replier.taken[0]._client
    await service.unserve("mesh.tool.a.>")
    assert lane_a.is_closed and set(service.lanes()) == {"mesh.tool.b.>"}
    with pytest.raises(nats.errors.NoRespondersError):
        await caller.request("mesh.tool.a.x", b"{}", timeout=2)
    assert (await caller.request("mesh.tool.b.y", b"{}", timeout=5)).data == b"taken mesh.tool.b.y"
    await caller.close()


async def test_without_a_lane_factory_groups_share_the_nodes_connection(
    nats_server: NatsServer, node_side: Any
) -> None:
    service, _ = await node_side(lanes=False)
    await service.serve("mesh.tool.a.>")
    assert service.lanes() == {"mesh.tool.a.>": service.nc.client_id}


async def test_what_a_lane_cannot_queue_is_answered_503_at_once_not_dropped(
    nats_server: NatsServer, node_side: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_api, "PENDING_MSGS", 3)
    service, replier = await node_side(hold_s=0.02)
    await service.serve("mesh.tool.a.>")
    caller = await nats.connect(nats_server.url)
    replies = await asyncio.gather(*[caller.request("mesh.tool.a.x", b"{}", timeout=10) for _ in range(60)])
    refused = [r for r in replies if r.headers and r.headers.get(HEADER_CODE) == "503"]
    taken = [r for r in replies if r.data == b"taken mesh.tool.a.x"]
    assert len(refused) + len(taken) == 60 and refused and taken, (len(refused), len(taken))
    error = json.loads(refused[0].data)["error"]
    assert error["kind"] == "overloaded" and error["node"] == "t" and error["subject"] == "mesh.tool.a.x", error
    assert len(replier.taken) == len(taken)
    await caller.close()
