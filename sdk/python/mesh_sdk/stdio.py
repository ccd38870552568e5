"""The stdio transport under the `mcp` library's server: the pipes read and written on the event loop.

The library's own `stdio_server` wraps stdin and stdout in anyio's thread-backed files, so
every line read and every answer written and flushed is a hand-over to a worker thread and
back: about 16 thread round trips per `tools/call`, most of a call's CPU (docs/performance.md,
"The Python SDK child"). Here the pipes are read and written with asyncio's non-blocking pipe
transports, and offered to the library as its own stream interface (`ReadStream` and
`WriteStream` of `SessionMessage`): `PipeReader.receive()` parses the next line with the
library's message adapter, `PipeWriter.send()` writes one line; no task or memory stream sits
between the pipe and whoever reads or writes it. `dispatcher.PipeDispatcher` reads the same
reader and writes already-serialized answers with `send_bytes`.

As the library does, fd 0 and fd 1 are moved out of the way while serving (fd 0 reads
/dev/null, fd 1 writes to stderr), so a stray `print` in a tool cannot corrupt the protocol.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest

# Longest line accepted from the node: beyond it the line is an error, not a buffer that grows.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Bytes read per wake-up (asyncio's default, 256 KiB, costs more per small message).
READ_CHUNK_BYTES = 64 * 1024
# Answers queued for the pipe before a writer waits for the node to read (asyncio's flow control).
WRITE_HIGH_WATER_BYTES = 1024 * 1024
# Frames kept from before the first request (the library's server keeps as many).
OPENING_LEAD_LIMIT = 8


def _take_fd(fd: int, stand_in: int) -> int:
    """A private duplicate of `fd` (the wire); `fd` itself now refers to `stand_in`."""
    private = os.dup(fd)
    os.set_inheritable(private, False)  # a tool's subprocess must not hold the node's pipe
    os.dup2(stand_in, fd)
    return private


class _Lines(asyncio.Protocol):
    """Splits what arrives on stdin into lines and hands each to the session, in order."""

    def __init__(self, queue: asyncio.Queue[bytes | None]) -> None:
        self.queue = queue
        self.partial = b""
        self.transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if hasattr(transport, "max_size"):
            transport.max_size = READ_CHUNK_BYTES

    def data_received(self, data: bytes) -> None:
        if self.partial:
            data, self.partial = self.partial + data, b""
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self.queue.put_nowait(data[start:end])
            start = end + 1
        self.partial = data[start:]
        if len(self.partial) > MAX_LINE_BYTES:
            self.partial = b""
            self.queue.put_nowait(b"\x00too long")  # becomes a parse error, as a bad line does
        # The session reads lines one at a time; stop reading while it is behind (a bound).
        if self.queue.qsize() > 1024 and self.transport is not None:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        if self.partial.strip():
            self.queue.put_nowait(self.partial)
        self.queue.put_nowait(None)  # stdin closed: the node says "exit now"
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.queue.put_nowait(None)


class _Drain(asyncio.Protocol):
    """Flow control for the stdout pipe: writers wait while the pipe's buffer is over its mark."""

    def __init__(self) -> None:
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.lost = False

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.can_write.set()


class PipeReader:
    """The library's `ReadStream` of `SessionMessage`s, read straight off the stdin pipe.

    `receive()` takes the next line the pipe protocol split off and parses it; no task and no
    memory stream sits between the pipe and the library's loop (each such hop is a task
    switch per message: docs/performance.md).
    """

    def __init__(self, queue: asyncio.Queue[bytes | None], reading: asyncio.ReadTransport) -> None:
        self._queue = queue
        self._reading = reading
        self._closed = False
        self._replay: deque[SessionMessage | Exception] = deque()

    async def opening(self) -> JSONRPCRequest | None:
        """The first request the node sends (None if stdin closes first), without consuming it.

        It and up to OPENING_LEAD_LIMIT frames before it are replayed by `receive` in order;
        the library's server decides the protocol era by this request, as its own
        `serve_dual_era_loop` does, but without a relay task between the pipe and the loop.
        """
        lead: list[SessionMessage | Exception] = []
        try:
            while True:
                item = await self.receive()
                if isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCRequest):
                    lead.append(item)
                    self._replay.extend(lead)
                    return item.message
                if len(lead) < OPENING_LEAD_LIMIT:
                    lead.append(item)
        except anyio.EndOfStream:
            self._replay.extend(lead)
            return None

    async def receive(self) -> SessionMessage | Exception:
        if self._replay:
            return self._replay.popleft()
        queue = self._queue
        while True:
            if self._closed:
                raise anyio.EndOfStream
            line = queue.get_nowait() if queue.qsize() else await queue.get()
            if line is None:
                self._closed = True
                raise anyio.EndOfStream
            if not self._reading.is_reading() and queue.qsize() < 256:
                self._reading.resume_reading()
            if not line.strip():
                continue
            try:
                return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
            except Exception as exc:  # the library answers a bad line with a parse error
                return exc

    def __aiter__(self) -> PipeReader:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> PipeReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class PipeWriter:
    """The library's `WriteStream` of `SessionMessage`s, written straight to the stdout pipe.

    `send()` serializes with the library's model and hands the bytes to the pipe transport;
    it waits only while the pipe holds more than WRITE_HIGH_WATER_BYTES the node has not read.
    """

    def __init__(self, pipe: asyncio.WriteTransport, drain: _Drain) -> None:
        self._pipe = pipe
        self._drain = drain
        self._closed = False

    async def send(self, item: SessionMessage, /) -> None:
        await self.send_bytes(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode())

    async def send_bytes(self, data: bytes) -> None:
        """Write one message already in JSON (a line of its own)."""
        if self._closed:
            raise anyio.ClosedResourceError
        if self._drain.lost:
            raise anyio.BrokenResourceError  # the node closed our stdout: nothing more can be said
        self._pipe.write(data + b"\n")
        if not self._drain.can_write.is_set():
            await self._drain.can_write.wait()

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> PipeWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _is_stream(fd: int) -> bool:
    """Whether asyncio can watch `fd`: a pipe, a socket or a terminal (not a regular file)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


def streams_supported() -> bool:
    """Whether stdin and stdout are both something this transport serves (the node's pipes are)."""
    return _is_stream(0) and _is_stream(1)


@asynccontextmanager
async def stdio_transport() -> AsyncIterator[tuple[PipeReader, PipeWriter]]:
    """The (read, write) streams of `SessionMessage` over this process's stdin and stdout."""
    loop = asyncio.get_running_loop()
    null_in = os.open(os.devnull, os.O_RDONLY)
    wire_in = _take_fd(0, null_in)
    wire_out = _take_fd(1, 2)
    os.close(null_in)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    reading, _ = await loop.connect_read_pipe(lambda: _Lines(queue), os.fdopen(wire_in, "rb", buffering=0))
    drain = _Drain()
    writing, _ = await loop.connect_write_pipe(lambda: drain, os.fdopen(wire_out, "wb", buffering=0))
    writing.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
    try:
        yield PipeReader(queue, reading), PipeWriter(writing, drain)
    finally:
        reading.close()
        writing.close()
        # Give the wire back to fd 0 and 1 is not needed: the process exits when serving ends.
