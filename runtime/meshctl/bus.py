"""One command's connection to the bus: opened for the verb, closed when it is done; no bus is one line."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from runtime.bus.connect import BusError, connect
from runtime.config import NatsConfig
from runtime.meshctl.errors import MeshError, Refused

# Why a node's own subjects ($SRV.*, mesh.node.*) go unanswered, when the bus itself answers.
NOT_MESH_ACCOUNT = "this connection is not in the mesh account (a caller account reaches the tool, seat, cancel and fetch subjects only)"


@contextlib.asynccontextmanager
async def bus(cfg: NatsConfig, name: str = "meshctl") -> AsyncIterator[Client]:
    try:
        nc = await connect(cfg, name, quiet=True)
    except BusError as e:
        raise MeshError(str(e)) from None
    try:
        yield nc
    finally:
        await nc.close()


async def ask(nc: Client, subject: str, body: bytes, timeout: float) -> Msg:
    """One request to a node's own subject; nobody there, or no answer, is the verb's refusal."""
    try:
        return await nc.request(subject, body, timeout=timeout)
    except NoRespondersError:
        raise Refused(
            f"nobody on the bus serves {subject}: no node of that name runs on this bus, or {NOT_MESH_ACCOUNT}"
        ) from None
    except NatsTimeout:
        raise Refused(f"no answer on {subject} within {timeout:g} s") from None


async def request(cfg: NatsConfig, subject: str, body: bytes, timeout: float) -> Msg:
    async with bus(cfg) as nc:
        return await ask(nc, subject, body, timeout)
