"""The stdio transport under the `mcp` library's server: the pipes read and written on the event loop.

The library's own `stdio_server` wraps stdin and stdout in anyio's thread-backed files, so
every line read and every answer written and flushed is a hand-over to a worker thread and
back: about 16 thread round trips per `tools/call`, most of a call's CPU (docs/performance.md,
"The Python SDK child"). This transport hands the library the same two streams of
`SessionMessage` (its transport interface, as its HTTP transports do) but reads and writes the
pipes with asyncio's non-blocking pipe transports. Parsing and serializing stay the library's
(`jsonrpc_message_adapter`, `model_dump_json`), so the protocol is unchanged.

As the library does, fd 0 and fd 1 are moved out of the way while serving (fd 0 reads
/dev/null, fd 1 writes to stderr), so a stray `print` in a tool cannot corrupt the protocol.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.shared._context_streams import ContextReceiveStream, ContextSendStream, create_context_streams
from mcp.shared.message import SessionMessage

# Longest line accepted from the node: beyond it the line is an error, not a buffer that grows.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Bytes read per wake-up (asyncio's default, 256 KiB, costs more per small message).
READ_CHUNK_BYTES = 64 * 1024
# Answers queued for the pipe before a writer waits for the node to read (asyncio's flow control).
WRITE_HIGH_WATER_BYTES = 1024 * 1024


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


async def _read(
    queue: asyncio.Queue[bytes | None], reading: asyncio.ReadTransport, sink: ContextSendStream[Any]
) -> None:
    async with sink:
        while (line := await queue.get()) is not None:
            if reading.is_reading() is False and queue.qsize() < 256:
                reading.resume_reading()
            if not line.strip():
                continue
            try:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except Exception as exc:  # the library answers a bad line with a parse error
                await sink.send(exc)
                continue
            await sink.send(SessionMessage(message))


async def _write(source: ContextReceiveStream[SessionMessage], pipe: asyncio.WriteTransport, drain: _Drain) -> None:
    async with source:
        async for session_message in source:
            if drain.lost:
                return  # the node closed our stdout: nothing more can be said
            data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
            pipe.write(data.encode() + b"\n")
            if not drain.can_write.is_set():
                await drain.can_write.wait()


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
async def stdio_transport() -> AsyncIterator[tuple[ContextReceiveStream[Any], ContextSendStream[SessionMessage]]]:
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
    to_session, from_pipe = create_context_streams[SessionMessage | Exception](0)
    to_pipe, from_session = create_context_streams[SessionMessage](0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read, queue, reading, to_session)
            tg.start_soon(_write, from_session, writing, drain)
            yield from_pipe, to_pipe
            tg.cancel_scope.cancel()
    finally:
        reading.close()
        writing.close()
        # Give the wire back to fd 0 and 1 is not needed: the process exits when serving ends.
