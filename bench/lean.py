"""A lean MCP client over a child's stdio: the "direct stdio" leg the node is measured against.

It is what a JSON-RPC client on one pipe needs and nothing more: requests written as bytes,
answers split into lines by an asyncio protocol, decoded with msgspec and matched to their
future by id. Reads are capped at 64 KiB: asyncio reads 256 KiB per call by default, which
costs tens of microseconds for every small message.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

READ_SIZE = 64 * 1024
PROTOCOL_VERSION = "2025-11-25"


class _Answer(msgspec.Struct):
    id: int | str | None = None
    method: str | None = None
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: dict[str, Any] | None = None


_decode = msgspec.json.Decoder(_Answer).decode
_encode = msgspec.json.encode


class LeanError(Exception):
    pass


class _Pipes(asyncio.SubprocessProtocol):
    def __init__(self, client: "LeanClient") -> None:
        self.client = client
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        out = transport.get_pipe_transport(1)  # type: ignore[attr-defined]
        if out is not None and hasattr(out, "max_size"):
            out.max_size = READ_SIZE

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return  # the child's log; the benchmark does not keep it
        if self.buf:
            data, self.buf = self.buf + data, b""
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self.client._line(data[start:end])
            start = end + 1
        self.buf = data[start:]

    def process_exited(self) -> None:
        self.client._gone()


class LeanClient:
    def __init__(self) -> None:
        self._pending: dict[int, asyncio.Future[msgspec.Raw]] = {}
        self._next = 0
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: Any = None
        self.pid = 0

    async def start(self, argv: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.subprocess_exec(
            lambda: _Pipes(self), *argv, cwd=cwd, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        self._stdin = self._transport.get_pipe_transport(0)
        self.pid = self._transport.get_pid()

    def _line(self, line: bytes) -> None:
        try:
            answer = _decode(line)
        except msgspec.DecodeError:
            return
        fut = self._pending.pop(answer.id, None) if answer.method is None else None  # type: ignore[arg-type]
        if fut is None or fut.done():
            return
        if answer.error is not None:
            fut.set_exception(LeanError(f"{answer.error.get('code')}: {answer.error.get('message')}"))
        else:
            fut.set_result(answer.result)

    def _gone(self) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(LeanError("the child exited"))

    def request_bytes(self, method: bytes, params: bytes) -> "asyncio.Future[msgspec.Raw]":
        self._next += 1
        rid = self._next
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._stdin.write(b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":%s}\n' % (rid, method, params))
        return fut

    async def initialize(self) -> dict[str, Any]:
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
        raw = await self.request_bytes(b"initialize", _encode(params))
        self._stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        return msgspec.json.decode(raw)

    async def list_tools(self) -> list[dict[str, Any]]:
        return msgspec.json.decode(await self.request_bytes(b"tools/list", b"{}"))["tools"]

    async def call(self, tool: str, arguments: bytes) -> msgspec.Raw:
        return await self.request_bytes(b"tools/call", b'{"name":%s,"arguments":%s}' % (_encode(tool), arguments))

    async def close(self) -> None:
        if self._transport is None:
            return
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()  # closing stdin means "exit now"
        for _ in range(200):
            if self._transport.get_returncode() is not None:
                break
            await asyncio.sleep(0.01)
        else:
            self._transport.kill()
        self._transport.close()
        self._transport = None
