"""The paths a tool call can take, and how one of them is measured.

A path opens a session (a bus connection, a child on pipes, an HTTP session) and gives one
coroutine that makes one call and checks its answer. A measurement is: a warm-up, N calls one
after the other (latency: p50, p99), then M calls with 32 in flight (calls/s), with the CPU time
of the processes that serve the path read from /proc before and after each phase.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from nats.aio.client import Client

from .lean import LeanClient
from .procs import cpu_ns, newest_descendant

Call = Callable[[], Awaitable[None]]
ERROR_HEADER = "Nats-Service-Error-Code"


class PathFailed(Exception):
    pass


@dataclass
class CallPath:
    name: str
    group: str  # node | leg | peer | info | language
    describe: str
    open: Callable[[], Any]  # an async context manager yielding a Call
    watch: dict[str, int] = field(default_factory=dict)  # label -> pid whose CPU is read
    seq_calls: int = 2000
    conc_calls: int = 10000


@dataclass
class Measurement:
    latencies_ns: list[int]
    calls_per_s: float
    cpu_us_seq: dict[str, float]
    cpu_us_conc: dict[str, float]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ns)
        return {
            "p50_us": percentile(lat, 50) / 1000,
            "p99_us": percentile(lat, 99) / 1000,
            "calls_per_s": self.calls_per_s,
            "cpu_us_per_call_seq": self.cpu_us_seq,
            "cpu_us_per_call_conc": self.cpu_us_conc,
            "seq_calls": len(lat),
        }


def percentile(sorted_values: list[int], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * p // 100))  # ceil(n * p / 100)
    return float(sorted_values[int(rank) - 1])


def _cpu(watch: dict[str, int]) -> dict[str, int]:
    return {label: cpu_ns(pid) for label, pid in watch.items()}


def _per_call(before: dict[str, int], after: dict[str, int], calls: int) -> dict[str, float]:
    return {label: (after[label] - before[label]) / 1000 / calls for label in before}


async def measure(path: CallPath, seq_calls: int, conc_calls: int, concurrency: int = 32) -> Measurement:
    async with path.open() as call:
        # The processes that serve the path, then the child a session started, then this one.
        watch = {**path.watch, **getattr(call, "pids", {}), "client": os.getpid()}
        for _ in range(max(50, seq_calls // 10)):  # warm-up: caches, lazy imports, pipes
            await call()
        await _concurrent(call, min(conc_calls, 500), concurrency)
        gc.collect()
        gc.disable()  # the client is the instrument: its own collector pauses are not the path's
        try:
            latencies = []
            before = _cpu(watch)
            clock = time.perf_counter_ns
            for _ in range(seq_calls):
                t = clock()
                await call()
                latencies.append(clock() - t)
            cpu_seq = _per_call(before, _cpu(watch), seq_calls)
            before = _cpu(watch)
            elapsed = await _concurrent(call, conc_calls, concurrency)
            cpu_conc = _per_call(before, _cpu(watch), conc_calls)
        finally:
            gc.enable()
    return Measurement(latencies, conc_calls / elapsed, cpu_seq, cpu_conc)


async def _concurrent(call: Call, total: int, concurrency: int) -> float:
    left = total

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


# --- the paths --------------------------------------------------------------------------
def nats_path(nc: Client, subject: str, body: bytes) -> Callable[[], Any]:
    """A request on the bus; the answer must not be a runtime error."""

    @asynccontextmanager
    async def open_() -> AsyncIterator[Call]:
        request = nc.request

        async def call() -> None:
            msg = await request(subject, body, timeout=10)
            if msg.headers and ERROR_HEADER in msg.headers:
                raise PathFailed(f"{subject}: {msg.headers[ERROR_HEADER]} {msg.data[:300]!r}")

        await call()
        yield call

    return open_


def client_path(nc: Client, subject: str, arguments: dict[str, Any], progress: bool = False) -> Callable[[], Any]:
    """A call through the bus call protocol's client (runtime/client.py): Mesh-Call-Id and
    Mesh-Timeout-Ms on every request, so the node takes its path for calls with options; with
    `progress`, Mesh-Progress too (as the MCP face asks on every call)."""
    from runtime.client import MeshClient

    def dropped(frame: Any) -> None:
        pass

    on_progress = dropped if progress else None

    @asynccontextmanager
    async def open_() -> AsyncIterator[Call]:
        caller = MeshClient(nc)

        async def call() -> None:
            await caller.call(subject, arguments, timeout_s=10, on_progress=on_progress)

        await call()
        try:
            yield call
        finally:
            await caller.close()

    return open_


def lean_stdio_path(argv: list[str], tool: str, arguments: bytes) -> Callable[[], Any]:
    """The child on our own pipes, through the lean client."""

    @asynccontextmanager
    async def open_() -> AsyncIterator[Call]:
        client = LeanClient()
        await client.start(argv)
        try:
            await client.initialize()
            await client.list_tools()
            request = client.request_bytes
            params = b'{"name":"%s","arguments":%s}' % (tool.encode(), arguments)

            async def call() -> None:
                await request(b"tools/call", params)

            call.pids = {"child": client.pid}  # type: ignore[attr-defined]
            yield call
        finally:
            await client.close()

    return open_


def sdk_stdio_path(argv: list[str], tool: str, arguments: dict[str, Any]) -> Callable[[], Any]:
    """The child on pipes through the mcp SDK's stdio client and ClientSession."""

    @asynccontextmanager
    async def open_() -> AsyncIterator[Call]:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=argv[0], args=argv[1:])
        async with AsyncExitStack() as stack:
            devnull = stack.enter_context(open("/dev/null", "w"))
            read, write = await stack.enter_async_context(stdio_client(params, errlog=devnull))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            call = _sdk_call(session, tool, arguments)
            child = newest_descendant(os.getpid(), "echo_child.py")  # the one the SDK just started
            if child:
                call.pids = {"child": child}  # type: ignore[attr-defined]
            yield call

    return open_


def http_path(url: str, tool: str, arguments: dict[str, Any], peer_pid: int = 0) -> Callable[[], Any]:
    """A peer's streamable HTTP endpoint through the mcp SDK's HTTP client and ClientSession."""

    @asynccontextmanager
    async def open_() -> AsyncIterator[Call]:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with AsyncExitStack() as stack:
            streams = await stack.enter_async_context(streamable_http_client(url))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            call = _sdk_call(session, tool, arguments)
            child = newest_descendant(peer_pid, "echo_child.py") if peer_pid else None
            if child:
                call.pids = {"child": child}  # type: ignore[attr-defined]  # the session's own child
            yield call

    return open_


def _sdk_call(session: Any, tool: str, arguments: dict[str, Any]) -> Call:
    async def call() -> None:
        result = await session.call_tool(tool, arguments)
        if getattr(result, "is_error", False) or getattr(result, "isError", False):
            raise PathFailed(f"{tool}: the tool answered isError: {result}")

    return call


def python() -> str:
    return sys.executable


def lean_http_path(url: str, tool: str, arguments: dict[str, Any], era: str = "2025-11-25",
                   peer_pid: int = 0) -> Callable[[], Any]:
    """A Streamable HTTP endpoint through the lean HTTP client (bench/lean_http.py): one keep-alive
    connection per call in flight, so that the figures are the server's."""
    from .lean_http import LeanMcpHttp

    @asynccontextmanager
    async def open_() -> AsyncIterator[Call]:
        client = await LeanMcpHttp.open(url, era, connections=32)
        try:
            tail, extra = client.call_bytes(tool, arguments)
            prepared = client.call_prepared

            async def call() -> None:
                await prepared(tail, extra)

            await call()
            child = newest_descendant(peer_pid, "echo_child.py") if peer_pid else None
            if child:
                call.pids = {"child": child}  # type: ignore[attr-defined]
            yield call
        finally:
            await client.close()

    return open_
