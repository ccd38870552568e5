"""Prometheus metrics of one node at `/metrics` (`[metrics] listen`, `meshctl node run --metrics ADDR`).

Nothing is counted twice and nothing is counted on the hot path for Prometheus' sake: a scrape
reads what the node keeps anyway (each endpoint's `EndpointStats`, the runners, the seats, the
desk, the reconciler) and the `prometheus_client` package writes the exposition. Label values
are bounded: a subject label only for a subject the node serves (every other subject is one
series, `subject="other"`), a module label only for a module name that is a name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from runtime.bus.service_api import DURATION_BUCKETS, EndpointStats
from runtime.calls.desk import CallDesk
from runtime.calls.dispatch import Dispatcher
from runtime.config import listen_problem
from runtime.delivery.reconciler import Reconciler
from runtime.node.modules import ModuleHost

log = logging.getLogger("mesh.metrics")

# Every state a bundle's status can show (launcher, seats' standing, services): one series each.
STATES = ("building", "starting", "ready", "restarting", "backoff", "failed", "stopped", "standby", "running")
MAX_REQUEST_BYTES = 8192  # of a scrape's request head; a longer one is refused
READ_TIMEOUT_S = 5.0


@dataclass
class NodeParts:
    """What a scrape reads, all of the running node."""

    modules: ModuleHost
    dispatcher: Dispatcher
    desk: CallDesk
    reconciler: Callable[[], Reconciler | None]


class NodeCollector(Collector):
    def __init__(self, parts: NodeParts) -> None:
        self.parts = parts

    def collect(self) -> Iterator[Metric]:
        p = self.parts
        calls = CounterMetricFamily("mesh_calls", "Calls answered, by subject and code", labels=["subject", "code"])
        duration = HistogramMetricFamily(
            "mesh_call_duration_seconds", "Arrival to reply, by subject", labels=["subject"]
        )
        endpoints: list[tuple[str, EndpointStats]] = [(r.subject, r.stats) for r in p.modules.table.routes.values()]
        endpoints.append(("other", p.dispatcher.unrouted))
        for subject, stats in endpoints:
            for code, n in sorted(stats.codes.items()):
                calls.add_metric([subject, code], n)
            if stats.num_requests:
                cumulative, buckets = 0, []
                for bound, n in zip((*map(str, DURATION_BUCKETS), "+Inf"), stats.buckets):
                    cumulative += n
                    buckets.append((bound, cumulative))
                duration.add_metric([subject], buckets, stats.seconds)
        yield calls
        yield duration

        in_flight = GaugeMetricFamily("mesh_calls_in_flight", "Calls written to the child", labels=["bundle"])
        waiting = GaugeMetricFamily("mesh_calls_waiting", "Calls waiting for a free slot", labels=["bundle"])
        up = GaugeMetricFamily("mesh_bundle_up", "1 when the bundle serves", labels=["bundle"])
        restarts = CounterMetricFamily("mesh_bundle_restarts", "Restarts of the bundle's child", labels=["bundle"])
        state = GaugeMetricFamily("mesh_bundle_state", "1 for the bundle's current state", labels=["bundle", "state"])
        for status in p.modules.bundle_statuses():
            key = f"{status.module}/{status.bundle}"
            in_flight.add_metric([key], status.in_flight)
            up.add_metric([key], 1 if status.state in ("ready", "running") else 0)
            restarts.add_metric([key], status.restarts)
            for s in STATES:
                state.add_metric([key, s], 1 if status.state == s else 0)
        for runner in p.modules.runners():
            waiting.add_metric([runner.key], runner.waiting)
        yield from (in_flight, waiting, up, restarts, state)

        held = GaugeMetricFamily("mesh_seat_held", "1 when this node holds the seat", labels=["seat"])
        for claim in p.modules.seats.status.values():
            held.add_metric([claim.seat], 1 if claim.state == "held" else 0)
        failed = CounterMetricFamily(
            "mesh_lease_renewals_failed", "Renewals of a held seat lease that did not go through", labels=["seat"]
        )
        for name, keeper in sorted(p.modules.seats.keepers.items()):
            failed.add_metric([name], keeper.renewals_failed)
        yield held
        yield failed

        deliveries = CounterMetricFamily(
            "mesh_deliveries", "Delivered modules by what became of them", labels=["module", "result"]
        )
        reconciler = p.reconciler()
        for (module, result), n in sorted((reconciler.deliveries if reconciler else {}).items()):
            deliveries.add_metric([module, result], n)
        yield deliveries
        yield CounterMetricFamily(
            "mesh_progress_frames", "Progress frames sent to callers", value=p.desk.progress_frames
        )
        yield CounterMetricFamily("mesh_cancels", "Cancels honoured", value=p.desk.cancels_honoured)


def registry_of(parts: NodeParts) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(parts))
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
    return registry


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or `:PORT`, loopback; port 0 any free one) of the metrics endpoint, as config.py checks it."""
    if why := listen_problem(text):
        raise ValueError(why)
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class MetricsServer:
    """A small HTTP/1.1 server of `GET /metrics` on the node's event loop (the scrape reads state that
    only the loop changes, so it runs there too)."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        self.host, self.port = parse_listen(listen)
        self.registry = registry
        self.scrapes = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        async with listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            log.info("metrics at http://%s:%d/metrics", self.host, self.port)
            task_status.started()
            await listener.serve(self._serve_one)

    async def _serve_one(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(READ_TIMEOUT_S):
                    head = await _read_head(stream)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError):
                return
            line = head.split(b"\r\n", 1)[0].split()
            if len(line) != 3 or line[0] not in (b"GET", b"HEAD"):
                await _respond(stream, b"405 Method Not Allowed", b"text/plain", b"GET /metrics\n")
                return
            if line[1].split(b"?", 1)[0] != b"/metrics":
                await _respond(stream, b"404 Not Found", b"text/plain", b"the metrics are at /metrics\n")
                return
            self.scrapes += 1
            body = generate_latest(self.registry)
            await _respond(stream, b"200 OK", CONTENT_TYPE_LATEST.encode(), body, head_only=line[0] == b"HEAD")


async def _read_head(stream: anyio.abc.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive(4096)
        if len(data) > MAX_REQUEST_BYTES:
            raise ValueError("request head too long")
    return data


async def _respond(
    stream: anyio.abc.SocketStream, status: bytes, kind: bytes, body: bytes, head_only: bool = False
) -> None:
    head = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        status,
        kind,
        len(body),
    )
    try:
        await stream.send(head + (b"" if head_only else body))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
