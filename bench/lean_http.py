"""A lean MCP client over Streamable HTTP, as an instrument: so that a path's figures are the
server's, not the client's (the `mcp` SDK's HTTP client costs about a millisecond of CPU a call).

One HTTP/1.1 keep-alive connection per call in flight (an asyncio protocol, requests built as
bytes, responses parsed just enough: status, headers, a Content-Length or chunked body, the
`data:` line of an SSE stream). It opens a 2025-11-25 session (`initialize`, `Mcp-Session-Id`,
`notifications/initialized`), or speaks the stateless 2026-07-28 revision (the `_meta` envelope
and the routing headers on every request). It checks every answer: a JSON-RPC result without
`isError`, for the request's id.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

MAX_RESPONSE = 4 * 1024 * 1024  # bytes of one response; more is a broken peer, not a measurement
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
ACCEPT = b"application/json, text/event-stream"


class LeanHttpError(Exception):
    pass


class _Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def message(self) -> dict[str, Any]:
        """The JSON-RPC message of a JSON body or of an SSE stream's last `data:` line."""
        if self.headers.get(b"content-type", b"").startswith(b"text/event-stream"):
            data = [line[5:].strip() for line in self.body.split(b"\n") if line.startswith(b"data:")]
            if not data:
                raise LeanHttpError(f"an SSE answer with no data line: {self.body[:300]!r}")
            return json.loads(data[-1])
        return json.loads(self.body)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[_Response] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(LeanHttpError(f"connection closed ({exc})"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_RESPONSE:
            self.waiter and not self.waiter.done() and self.waiter.set_exception(LeanHttpError("response too large"))
            return
        response = self._parse()
        if response is not None and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(response)

    def _parse(self) -> _Response | None:
        buf = self.buffer
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(buf[:end]).split(b"\r\n")
        status = int(head[0].split(b" ", 2)[1])
        headers: dict[bytes, bytes] = {}
        for line in head[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if b"content-length" in headers:
            size = int(headers[b"content-length"])
            if len(buf) < start + size:
                return None
            body = bytes(buf[start : start + size])
            del buf[: start + size]
            return _Response(status, headers, body)
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts, at = [], start
            while True:
                line_end = buf.find(b"\r\n", at)
                if line_end < 0:
                    return None
                size = int(bytes(buf[at:line_end]).split(b";")[0], 16)
                if len(buf) < line_end + 2 + size + 2:
                    return None
                if size == 0:
                    del buf[: line_end + 4]
                    return _Response(status, headers, b"".join(parts))
                parts.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
                at = line_end + 2 + size + 2
        if status in (202, 204, 304) or 100 <= status < 200:
            del buf[:start]
            return _Response(status, headers, b"")
        return None  # a body until close: not used by any server measured here

    async def request(self, raw: bytes) -> _Response:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        try:
            return await self.waiter
        finally:
            self.waiter = None


class LeanMcpHttp:
    """`await LeanMcpHttp.open(url, era)`, then `await client.call(name, arguments)` from up to
    `connections` tasks at once (each call takes a free connection)."""

    def __init__(self, url: str, era: str) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
        self.era = era
        self.session: bytes | None = None
        self.free: list[_Connection] = []
        self.all: list[_Connection] = []
        self.waiting: asyncio.Queue[_Connection] = asyncio.Queue()
        self.next_id = 0

    @classmethod
    async def open(cls, url: str, era: str = LEGACY, connections: int = 32) -> LeanMcpHttp:
        client = cls(url, era)
        loop = asyncio.get_running_loop()
        for _ in range(connections):
            _, conn = await loop.create_connection(_Connection, client.host, client.port)
            client.all.append(conn)
            client.waiting.put_nowait(conn)
        if era == LEGACY:
            await client._handshake()
        return client

    async def close(self) -> None:
        if self.session is not None:
            try:
                await self._send(b"DELETE", b"", extra=b"")
            except Exception:
                pass
        for conn in self.all:
            if conn.transport is not None:
                conn.transport.close()

    def _head(self, method: bytes, body: bytes, extra: bytes) -> bytes:
        session = b"mcp-session-id: " + self.session + b"\r\n" if self.session is not None else b""
        return (
            method + b" " + self.path.encode() + b" HTTP/1.1\r\nhost: " + f"{self.host}:{self.port}".encode()
            + b"\r\ncontent-type: application/json\r\naccept: " + ACCEPT + b"\r\n" + session + extra
            + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )

    async def _send(self, method: bytes, body: bytes, extra: bytes = b"") -> _Response:
        conn = await self.waiting.get()
        try:
            return await conn.request(self._head(method, body, extra))
        finally:
            self.waiting.put_nowait(conn)

    async def _handshake(self) -> None:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "lean-http", "version": "1"}}}
        response = await self._send(b"POST", json.dumps(init).encode())
        if response.status != 200:
            raise LeanHttpError(f"initialize: HTTP {response.status}: {response.body[:300]!r}")
        self.session = response.headers.get(b"mcp-session-id")
        answer = response.message()
        if "result" not in answer:
            raise LeanHttpError(f"initialize: {answer}")
        done = await self._send(b"POST", b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                                b"mcp-protocol-version: " + LEGACY.encode() + b"\r\n")
        if done.status not in (200, 202):
            raise LeanHttpError(f"notifications/initialized: HTTP {done.status}")

    def call_bytes(self, name: str, arguments: dict[str, Any]) -> tuple[bytes, bytes]:
        """(the body after its id, the extra headers) of a tools/call, built once per path."""
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if self.era == MODERN:
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "lean-http", "version": "1"},
            }
            extra = (b"mcp-protocol-version: " + MODERN.encode() + b"\r\nmcp-method: tools/call\r\nmcp-name: "
                     + name.encode() + b"\r\n")
        else:
            extra = b"mcp-protocol-version: " + LEGACY.encode() + b"\r\n"
        tail = b',"method":"tools/call","params":' + json.dumps(params, separators=(",", ":")).encode() + b"}"
        return tail, extra

    async def call_prepared(self, tail: bytes, extra: bytes) -> None:
        self.next_id += 1
        rid = self.next_id
        response = await self._send(b"POST", b'{"jsonrpc":"2.0","id":' + str(rid).encode() + tail, extra)
        if response.status != 200:
            raise LeanHttpError(f"tools/call: HTTP {response.status}: {response.body[:300]!r}")
        answer = response.message()
        result = answer.get("result")
        if answer.get("id") != rid or not isinstance(result, dict) or result.get("isError"):
            raise LeanHttpError(f"tools/call: not a result for id {rid}: {str(answer)[:300]}")
