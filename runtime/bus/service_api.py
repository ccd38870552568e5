"""The node as a NATS Service API service: one owner of its subscriptions, endpoints and stats.

Shaped after nats.go's `micro` (service, group, endpoint, request, stats), with two departures:
tools come and go with their bundles without a resubscription (a module's tools are one
subscription, `mesh.tool.<module>.>`, a held seat's verbs another), and requests are handled
concurrently (one task each, owned by the dispatcher). nats-py's `micro` can do neither, so the
node answers the (small) Service API protocol itself; `nats micro ls/info/stats` see every node.

Each group's requests arrive on a connection of their own (a lane), while the answers, the
Service API verbs and everything else of the node go on its own connection. The server gives a
connection that reads too slowly `max_pending` bytes (64 MB by default) and then drops it (a
slow consumer); no client reads as fast as any producer can write, so a flood of requests at one
module can cost a connection. With lanes it costs that module's lane only (it reconnects on its
own, its calls already taken are still answered); the node's connection, every other module's
requests and the calls in flight on them are not touched. What a lane has read and its node
cannot queue (`PENDING_MSGS`, `PENDING_BYTES`) is answered 503 at once, not dropped.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import logging
import time
from typing import Any, Awaitable, Callable, Iterable, Protocol

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import SlowConsumerError, UnexpectedEOF
from nats.nuid import NUID

from runtime.bus.connect import settle
from runtime.wire.errors import IntakeFull, render
from runtime.wire.subjects import SERVICE_NAME, SERVICE_VERBS, SERVICE_VERSION, service_subject, service_subjects

log = logging.getLogger("mesh.service")

_encode = msgspec.json.encode

# The requests one group's subscription holds, read and not yet taken by the dispatcher (which
# takes each at once, in the subscription's callback: these fill only while the node's loop lags).
PENDING_MSGS = 4096
PENDING_BYTES = 64 * 1024 * 1024

# A lane's errors that are its drop or an outage: said once by its disconnect callback instead.
_DROPS = (OSError, asyncio.TimeoutError, UnexpectedEOF)

# A connection of its own for one group's requests: (label, error callback) -> a connected client.
ErrorCallback = Callable[[Exception], Awaitable[None]]
LaneFactory = Callable[[str, ErrorCallback], Awaitable[Client]]


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


class _Group:
    """One group's subscription and the connection it takes requests on (its lane, or the node's)."""

    __slots__ = ("sub", "nc", "refused", "said_at")

    def __init__(self, sub: Subscription, nc: Client) -> None:
        self.sub, self.nc = sub, nc
        self.refused = 0  # requests answered 503 because its pending bound was full
        self.said_at = 0.0  # when the log last said so


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
        lane: LaneFactory | None = None,
    ) -> None:
        self.nc = nc
        self._lane = lane  # None: every group on `nc` (a test's service, or lanes turned off)
        self.node = node
        self.queue_group = queue_group
        self.id = NUID().next().decode()
        self.description = description
        self._handler = handler
        self._endpoints = endpoints
        self._metadata = metadata
        self._verbs: list[Subscription] = []
        self._groups: dict[str, _Group] = {}
        self._changing = asyncio.Lock()  # serve/unserve of a group: one lane per group, never two
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
        groups, self._groups = list(self._groups.values()), {}
        for group in groups:  # left by a drain that failed: their lanes end with the service
            await self._close_lane(group)

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
        """Take requests on `subject` (a wildcard of endpoints); serving it already is nothing new.

        On a lane of its own when the service has a lane factory (the node's connection when the
        lane cannot connect, said in a WARNING); subscribed at the server when this returns.
        """
        async with self._changing:
            if subject in self._groups:
                return
            nc = self.nc
            if self._lane is not None:
                try:
                    nc = await self._lane(subject, self._lane_error(subject))
                except Exception as e:  # the bus went away meanwhile: serve it as before lanes
                    log.warning(
                        "requests on %s come on the node's own connection: no lane of their own (%s)", subject, e
                    )
                    nc = self.nc
            try:
                sub = await nc.subscribe(
                    subject,
                    queue=self.queue_group,
                    cb=self._on_request,
                    pending_msgs_limit=PENDING_MSGS,
                    pending_bytes_limit=PENDING_BYTES,
                )
                # On the server before anyone is told it serves: a call from another connection
                # must not meet "no responders" (settle: nats-py's flush alone can overtake the SUB).
                await settle(nc)
            except BaseException:
                if nc is not self.nc:
                    await _close_quietly(nc)
                raise
            self._groups[subject] = _Group(sub, nc)

    async def unserve(self, subject: str) -> None:
        """Stop taking requests on `subject`; the ones already delivered are still handled."""
        async with self._changing:
            group = self._groups.pop(subject, None)
            if group is not None:
                try:
                    await group.sub.drain()
                    # Gone at the server before this returns: a call made next meets "no responders",
                    # not a subscription on its way out (settle: drain's flush can overtake the UNSUB).
                    await settle(group.nc)
                finally:
                    await self._close_lane(group)

    def serving(self) -> list[str]:
        return list(self._groups)

    def lanes(self) -> dict[str, int | None]:
        """Each group's lane: the server's client id of the connection its requests come on."""
        return {subject: group.nc.client_id for subject, group in self._groups.items()}

    async def _close_lane(self, group: _Group) -> None:
        if group.nc is not self.nc:
            await _close_quietly(group.nc)

    def _lane_error(self, subject: str) -> ErrorCallback:
        async def on_error(e: Exception) -> None:
            if isinstance(e, SlowConsumerError):
                await self._refuse(subject, e)
            elif not isinstance(e, _DROPS):
                log.warning("bus, lane of %s: %s", subject, e)

        return on_error

    async def _refuse(self, subject: str, e: SlowConsumerError) -> None:
        """A request read while the group's pending bound is full: answered 503 at once, not dropped."""
        group = self._groups.get(subject)
        if group is not None:
            group.refused += 1
            now = time.monotonic()
            if now - group.said_at >= 1.0:  # once a second at most: a flood is not a flood of lines
                group.said_at = now
                log.warning(
                    "requests on %s come faster than node %s takes them: %d answered 503 so far (%d requests "
                    "or %d bytes waiting at most)",
                    subject,
                    self.node,
                    group.refused,
                    PENDING_MSGS,
                    PENDING_BYTES,
                )
        if e.reply:
            data, headers = render(IntakeFull(e.subject, self.node, PENDING_MSGS, PENDING_BYTES))
            try:
                await self.nc.publish(e.reply, data, headers=headers)
            except Exception as failed:  # the bus is gone: nothing else to do
                log.debug("could not refuse %s: %s", e.subject, failed)

    async def _on_request(self, msg: Msg) -> None:
        self._handler(msg)  # the dispatcher takes it at once; each call is a task of its own

    async def drain(self) -> None:
        """Every group drained (a stop): no new request comes in."""
        for subject in list(self._groups):
            try:
                await self.unserve(subject)
            except Exception as e:  # a broken connection cannot drain; the calls it held are gone with it
                log.warning("could not drain %s: %s", subject, e)

    async def close_lanes(self) -> None:
        """Every lane's connection closed, undrained (the node ends however it ends: a killed task
        must not leave subscriptions on the server that take calls nobody answers)."""
        groups, self._groups = self._groups, {}
        for group in groups.values():
            await self._close_lane(group)


async def _close_quietly(nc: Client) -> None:
    try:
        await nc.close()
    except Exception:  # already closed, or the bus is gone: nothing is left to close
        pass


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
