"""The node as a NATS Service API service: `$SRV.PING/INFO/STATS` with endpoints that change.

nats-py's `micro` cannot remove an endpoint and runs one request per endpoint at a time, and
tools come and go with their bundles, so the node answers the (small) Service API protocol
itself. `nats micro ls/info/stats` see every node.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.nuid import NUID

from runtime.calls.routes import Route

log = logging.getLogger("mesh.service")

SERVICE_NAME = "mesh-node"
SERVICE_VERSION = "0.1.0"

_encode = msgspec.json.encode


async def collect_infos(nc: Client, wait: float) -> list[dict[str, Any]]:
    """Every node's Service API INFO answer that arrives within `wait` seconds.

    Several nodes answer one request, so this is a publish and a window, not nc.request.
    """
    infos: list[dict[str, Any]] = []
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(f"$SRV.INFO.{SERVICE_NAME}", b"", reply=inbox)
        with anyio.move_on_after(wait):
            while True:
                msg = await sub.next_msg(timeout=wait)
                try:
                    infos.append(msgspec.json.decode(msg.data))
                except msgspec.DecodeError:
                    continue  # a malformed answer says nothing
    except Exception:  # the window closed: what came is the answer
        pass
    finally:
        await sub.unsubscribe()
    return infos


class Service:
    """Answers the Service API's discovery and stats verbs for one node."""

    def __init__(
        self,
        nc: Client,
        *,
        node: str,
        queue_group: str,
        endpoints: Callable[[], list[Route]],
        metadata: Callable[[], dict[str, str]],
        description: str = "mesh node tool runtime",
    ) -> None:
        self.nc = nc
        self.node = node
        self.queue_group = queue_group
        self.id = NUID().next().decode()
        self.description = description
        self._endpoints = endpoints
        self._metadata = metadata
        self._subs: list[Subscription] = []
        self.started = dt.datetime.now(dt.UTC)

    async def start(self) -> None:
        for verb, handler in (("PING", self._ping), ("INFO", self._info), ("STATS", self._stats)):
            for subject in (f"$SRV.{verb}", f"$SRV.{verb}.{SERVICE_NAME}", f"$SRV.{verb}.{SERVICE_NAME}.{self.id}"):
                self._subs.append(await self.nc.subscribe(subject, cb=handler))

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may already be closed; nothing to undo then
                pass

    def _identity(self, kind: str) -> dict[str, Any]:
        return {
            "type": f"io.nats.micro.v1.{kind}_response",
            "name": SERVICE_NAME,
            "id": self.id,
            "version": SERVICE_VERSION,
            "metadata": self._metadata(),
        }

    def info(self) -> dict[str, Any]:
        return {
            **self._identity("info"),
            "description": self.description,
            "endpoints": [
                {
                    "name": r.endpoint_name(),
                    "subject": r.subject,
                    "queue_group": self.queue_group,
                    "metadata": r.metadata(),
                }
                for r in self._endpoints()
            ],
        }

    def stats(self) -> dict[str, Any]:
        endpoints = []
        for r in self._endpoints():
            endpoints.append(
                {
                    "name": r.endpoint_name(),
                    "subject": r.subject,
                    "queue_group": self.queue_group,
                    "num_requests": r.num_requests,
                    "num_errors": r.num_errors,
                    "last_error": r.last_error,
                    "processing_time": r.processing_ns,
                    "average_processing_time": r.processing_ns // r.num_requests if r.num_requests else 0,
                }
            )
        started = self.started.isoformat().replace("+00:00", "Z")
        return {**self._identity("stats"), "started": started, "endpoints": endpoints}

    async def _ping(self, msg: Msg) -> None:
        await self._answer(msg, self._identity("ping"))

    async def _info(self, msg: Msg) -> None:
        await self._answer(msg, self.info())

    async def _stats(self, msg: Msg) -> None:
        await self._answer(msg, self.stats())

    async def _answer(self, msg: Msg, body: dict[str, Any]) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, _encode(body))
