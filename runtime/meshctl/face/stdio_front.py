"""The face over stdio, with the hot path: one reader of stdin decides each line (`HotPath.decide`),
answers a hot `tools/call` or `tools/list` itself, and hands every other line to the `mcp`
package's stdio server, which serves it as it always did (`initialize`, the era of the connection,
errors, everything else). One writer of stdout carries both ways' answers, a line each.

The hot path waits until the package has opened the connection: the answer to the client's first
request says the era (the `initialize` result's protocolVersion, or a first request with the
2026-07-28 envelope answered), as the package's own loop decides it. A `notifications/cancelled`
for a hot call cancels its bus call (the node tells the tool) and, as the package's stdio
dispatcher does, the cancelled request gets no answer. At stdin's end the hot calls still running
are cancelled: nobody is left to answer.

Bounds: a line is at most `MAX_LINE` bytes (a longer one is dropped and said); at most
`PACKAGE_LINES` lines wait for the package (then stdin is read no further until it takes them);
stdout's buffer past asyncio's high-water mark makes every writer wait.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import anyio
import msgspec
from mcp.server.stdio import stdio_server
from mcp_types import PROTOCOL_VERSION_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from runtime.meshctl.face.hot import Era, HotCall, HotCancel, HotList
from runtime.meshctl.face.server import Face

log = logging.getLogger("mesh.face")

MAX_LINE = 16 * 1024 * 1024  # bytes of one message from the client
PACKAGE_LINES = 64  # lines read ahead for the package


class _Opening(msgspec.Struct):
    id: int | str | None = None
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: dict[str, Any] | None = None


class _Reply(msgspec.Struct):
    id: int | str | None = None
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Initialized(msgspec.Struct):
    protocolVersion: str = ""  # noqa: N815 (the wire's name)


_decode_opening = msgspec.json.Decoder(_Opening).decode
_decode_reply = msgspec.json.Decoder(_Reply).decode
_decode_initialized = msgspec.json.Decoder(_Initialized).decode


def pipes_on_stdio() -> bool:
    """stdin and stdout are pipes, sockets or terminals (what asyncio's pipe transports take)."""
    try:
        return all(stat.S_IFMT(os.fstat(fd).st_mode) in (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR) for fd in (0, 1))
    except OSError:
        return False


@contextmanager
def _claimed_stdio() -> Iterator[tuple[int, int]]:
    """Private copies of fds 0 and 1 for the wire; fd 0 reads the null device and fd 1 writes to
    stderr meanwhile, so nothing else in the process reads the client's lines or writes into them."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        os.close(wire_in)
        os.close(wire_out)


class StdioFront:
    """One client on a pair of pipes: the hot path for what it takes, the package for the rest."""

    def __init__(self, face: Face, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.face, self.reader, self.writer = face, reader, writer
        self.running: dict[int | str, asyncio.Timeout] = {}
        self.era = Era(None, running=self.running.keys())
        self._opened: bool | None = None  # the era the first request opened: True modern, False legacy
        self._answers = False  # its client declared elicitation, sampling or roots
        self._asked: dict[int | str, str] = {}  # id -> the version it would open: initialize, or an enveloped request
        self._to_package: asyncio.Queue[bytes | None] = asyncio.Queue(PACKAGE_LINES)
        self._calls: asyncio.TaskGroup | None = None
        self.served = 0

    async def serve(self) -> None:
        """Until the client closes stdin and the package's loop has ended."""
        async with asyncio.TaskGroup() as calls:  # the hot calls in flight, owned here
            self._calls = calls
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read)
                stdin, stdout = _PackageIn(self._to_package), _PackageOut(self)
                async with stdio_server(stdin=cast(Any, stdin), stdout=cast(Any, stdout)) as (read, write):
                    await self.face.server.run(read, write, self.face.server.create_initialization_options())
                tg.cancel_scope.cancel()
            self._cancel_all()

    async def _read(self) -> None:
        hot_path = self.face.hot
        try:
            while True:
                try:
                    line = await self.reader.readline()
                except ValueError:  # a line past MAX_LINE: the reader dropped it
                    log.warning("a message from the client longer than %d bytes was dropped", MAX_LINE)
                    continue
                if not line:
                    break
                decision = hot_path.decide(line, self.era) if self.era.version is not None else None
                if decision is None:
                    if self.era.version is None:
                        self._note_request(line)
                    await self._to_package.put(line)
                    continue
                self.served += 1
                if isinstance(decision, HotCall):
                    assert self._calls is not None
                    self._calls.create_task(self._call(decision))
                elif isinstance(decision, HotList):
                    await self._write(hot_path.list_page(decision))
                elif isinstance(decision, HotCancel):
                    handle = self.running.get(decision.request_id)
                    if handle is not None and handle.when() is None:
                        handle.reschedule(asyncio.get_running_loop().time())
        finally:
            self._cancel_all()
            await self._to_package.put(None)

    async def _call(self, hot: HotCall) -> None:
        if hot.id in self.running:
            await self._write(await self.face.hot.call(hot))  # the same id twice at once: answered, not tracked
            return
        handle = asyncio.timeout(None)  # a notifications/cancelled ends it
        try:
            async with handle:
                self.running[hot.id] = handle
                try:
                    answer = await self.face.hot.call(hot)
                finally:
                    self.running.pop(hot.id, None)
        except TimeoutError:
            if not handle.expired():
                raise
            return  # cancelled by the client: no answer, as the package's stdio dispatcher
        await self._write(answer)

    def _cancel_all(self) -> None:
        now = asyncio.get_running_loop().time()
        for handle in list(self.running.values()):
            if handle.when() is None:
                handle.reschedule(now)

    async def _write(self, message: bytes) -> None:
        self.writer.write(message + b"\n")
        await self.writer.drain()

    # --- the era, as the package opened the connection -------------------------------------
    def _note_request(self, line: bytes) -> None:
        """Before the era is known: the first request opens the connection in its era (the package's
        rule), and the `initialize` (legacy) or enveloped request (modern) whose result is seen says
        the connection is open."""
        try:
            request = _decode_opening(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if request.id is None or request.method is msgspec.UNSET:
            return  # a notification opens nothing
        meta = (request.params or {}).get("_meta")
        named = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
        modern = request.method != "initialize" and isinstance(named, str)
        if self._opened is None:
            self._opened = modern
        if len(self._asked) < 16:
            if modern and self._opened and isinstance(named, str):
                self._asked[request.id] = named
            elif request.method == "initialize" and not self._opened:
                self._asked[request.id] = ""
                self._answers = _declares_asks((request.params or {}).get("capabilities"))

    def package_wrote(self, line: bytes) -> None:
        if self.era.version is not None or not self._asked:
            return
        try:
            reply = _decode_reply(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if reply.id is None or reply.id not in self._asked:
            return
        named = self._asked.pop(reply.id)
        if reply.result is msgspec.UNSET:
            return  # refused: not open yet
        version: str | None
        if named:
            version = named if named in MODERN_PROTOCOL_VERSIONS else None
        else:
            try:
                version = _decode_initialized(reply.result).protocolVersion
            except (msgspec.DecodeError, msgspec.ValidationError):
                version = None
            if version not in HANDSHAKE_PROTOCOL_VERSIONS:
                version = None
        if version is not None and self._answers:
            # A client that answers a tool's asks: the package's way (face/asking.py) serves its calls.
            self._asked.clear()
        elif version is not None:
            self.era = Era(version, running=self.running.keys())
            self._asked.clear()
            log.debug("stdio connection opened at %s: the hot path serves its calls", version)


class _PackageIn:
    """The lines the hot path did not take, as the package's stdio server reads its stdin."""

    def __init__(self, queue: asyncio.Queue[bytes | None]) -> None:
        self.queue = queue

    def __aiter__(self) -> _PackageIn:
        return self

    async def __anext__(self) -> str:
        line = await self.queue.get()
        if line is None:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _PackageOut:
    """The package's stdout: its lines go to the one writer."""

    def __init__(self, front: StdioFront) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        data = text.encode()
        self.front.package_wrote(data)
        self.front.writer.write(data)
        await self.front.writer.drain()

    async def flush(self) -> None:
        pass  # every write is handed to the pipe at once


async def serve_stdio_front(face: Face) -> None:
    """The face to one client on this process's stdin and stdout."""
    with _claimed_stdio() as (wire_in, wire_out):
        await serve_pipes(face, wire_in, wire_out)


async def serve_pipes(face: Face, wire_in: int, wire_out: int, *, front: list[StdioFront] | None = None) -> None:
    """The face to one client on two pipe fds (left open: they are the caller's); `front` gets the front."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0, closefd=False)
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0, closefd=False)
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    serving = StdioFront(face, reader, writer)
    if front is not None:
        front.append(serving)
    try:
        await serving.serve()
    finally:
        read_transport.close()
        write_transport.close()


def _declares_asks(capabilities: Any) -> bool:
    """Whether an `initialize`'s client capabilities name something a tool may ask (face/asking.py)."""
    return isinstance(capabilities, dict) and any(k in capabilities for k in ("elicitation", "sampling", "roots"))
