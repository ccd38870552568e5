"""The node as a NATS Service API service: one owner of its subscriptions, endpoints and stats.

Shaped after nats.go's `micro` (service, group, endpoint, request, stats), with two departures:
tools come and go with their bundles without a resubscription (a module's tools are one
subscription, `mesh.tool.<module>.>`, a held seat's verbs another), and requests are handled
concurrently (one task each, owned by the dispatcher). nats-py's `micro` can do neither, so the
node answers the (small) Service API protocol itself; `nats micro ls/info/stats` see every node.
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
from typing import Any, Awaitable, Callable, Iterable, Protocol

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.nuid import NUID

from runtime.bus.connect import settle
from runtime.wire.subjects import SERVICE_NAME, SERVICE_VERBS, SERVICE_VERSION, service_subject, service_subjects

log = logging.getLogger("mesh.service")

_encode = msgspec.json.encode


# Upper bounds of the call duration histogram, in seconds: a node answers in well under a
# millisecond, a tool in anything up to minutes.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class EndpointStats:
    """One endpoint's counters: the Service API's, and what `/metrics` shows (runtime/node/metrics.py).

    Kept by subject across route rebuilds (calls/routes.py); recorded once per answer, on the event
    loop, with no lock: a scrape reads them on the same loop."""

    __slots__ = ("num_requests", "num_errors", "last_error", "processing_ns", "codes", "buckets", "seconds")

    def __init__(self) -> None:
        self.num_requests = 0
        self.num_errors = 0
        self.last_error = ""
        self.processing_ns = 0
        self.codes: dict[str, int] = {}  # "ok", "tool_error" or the runtime's error code -> answers
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)  # the last: above every bound
        self.seconds = 0.0

    def record(self, elapsed_ns: int, error: str | None, code: str = "ok") -> None:
        """One answered request (an error reply is recorded once, here, as micro's respondError does)."""
        self.num_requests += 1
        self.processing_ns += elapsed_ns
        if error is not None:
            self.num_errors += 1
            self.last_error = error[:512]
        self.codes[code] = self.codes.get(code, 0) + 1
        elapsed = elapsed_ns / 1e9
        self.seconds += elapsed
        self.buckets[bisect.bisect_left(DURATION_BUCKETS, elapsed)] += 1


class Endpoint(Protocol):
    """What the service lists of one endpoint (a route of the node's table)."""

    subject: str
    stats: EndpointStats

    def endpoint_name(self) -> str: ...
    def metadata(self) -> dict[str, str]: ...


Handler = Callable[[Msg], None]


class ServiceApi:
    """Answers `$SRV.PING/INFO/STATS` for one node and owns the subscriptions its requests come on.

    `serve(subject)` subscribes a group of endpoints (in the queue group, so several nodes share
    the load) with the one request handler; `unserve` drains it.
    """

    def __init__(
        self,
        nc: Client,
        *,
        node: str,
        queue_group: str,
        handler: Handler,
        endpoints: Callable[[], Iterable[Endpoint]],
        metadata: Callable[[], dict[str, str]],
        description: str = "mesh node tool runtime",
    ) -> None:
        self.nc = nc
        self.node = node
        self.queue_group = queue_group
        self.id = NUID().next().decode()
        self.description = description
        self._handler = handler
        self._endpoints = endpoints
        self._metadata = metadata
        self._verbs: list[Subscription] = []
        self._groups: dict[str, Subscription] = {}
        self.started = dt.datetime.now(dt.UTC)

    # --- the Service API's own verbs ---------------------------------------------------------
    async def start(self) -> None:
        for verb, answer in zip(SERVICE_VERBS, (self._ping, self.info, self.stats)):
            for subject in service_subjects(verb, self.id):
                self._verbs.append(await self.nc.subscribe(subject, cb=self._answerer(answer)))

    def _answerer(self, answer: Callable[[], dict[str, Any]]) -> Callable[[Msg], Awaitable[None]]:
        async def respond(msg: Msg) -> None:
            if msg.reply:
                await self.nc.publish(msg.reply, _encode(answer()))

        return respond

    async def stop(self) -> None:
        subs, self._verbs = self._verbs, []
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

    def _ping(self) -> dict[str, Any]:
        return self._identity("ping")

    def info(self) -> dict[str, Any]:
        return {
            **self._identity("info"),
            "description": self.description,
            "endpoints": [
                {
                    "name": e.endpoint_name(),
                    "subject": e.subject,
                    "queue_group": self.queue_group,
                    "metadata": e.metadata(),
                }
                for e in self._endpoints()
            ],
        }

    def stats(self) -> dict[str, Any]:
        endpoints = []
        for e in self._endpoints():
            s = e.stats
            endpoints.append(
                {
                    "name": e.endpoint_name(),
                    "subject": e.subject,
                    "queue_group": self.queue_group,
                    "num_requests": s.num_requests,
                    "num_errors": s.num_errors,
                    "last_error": s.last_error,
                    "processing_time": s.processing_ns,
                    "average_processing_time": s.processing_ns // s.num_requests if s.num_requests else 0,
                }
            )
        started = self.started.isoformat().replace("+00:00", "Z")
        return {**self._identity("stats"), "started": started, "endpoints": endpoints}

    # --- groups: the subscriptions requests arrive on -----------------------------------------
    async def serve(self, subject: str) -> None:
        """Take requests on `subject` (a wildcard of endpoints); serving it already is nothing new."""
        if subject in self._groups:
            return
        self._groups[subject] = await self.nc.subscribe(subject, queue=self.queue_group, cb=self._on_request)
        # Once the server has it: whoever is told "served" next (status, a change notice) may call at
        # once, from another connection, and must not meet "no responders" (seen in tests/node).
        await settle(self.nc)

    async def unserve(self, subject: str) -> None:
        """Stop taking requests on `subject`; the ones already delivered are still handled."""
        sub = self._groups.pop(subject, None)
        if sub is not None:
            await sub.drain()

    def serving(self) -> list[str]:
        return list(self._groups)

    async def _on_request(self, msg: Msg) -> None:
        self._handler(msg)  # the dispatcher takes it at once; each call is a task of its own

    async def drain(self) -> None:
        """Every group drained (a stop): no new request comes in."""
        for subject in list(self._groups):
            try:
                await self.unserve(subject)
            except Exception as e:  # a broken connection cannot drain; the calls it held are gone with it
                log.warning("could not drain %s: %s", subject, e)


async def collect_infos(nc: Client, wait: float) -> list[dict[str, Any]]:
    """Every node's Service API INFO answer that arrives within `wait` seconds.

    Several nodes answer one request, so this is a publish and a window, not nc.request.
    """
    infos: list[dict[str, Any]] = []
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(service_subject("INFO"), b"", reply=inbox)
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
