"""A real OTLP/HTTP trace receiver for the tests: POST /v1/traces, decoded with opentelemetry-proto."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    status_code: int


@dataclass
class Receiver:
    """Listens on 127.0.0.1; every span of every export is kept in `spans`."""

    spans: list[Span] = field(default_factory=list)
    port: int = 0
    _server: asyncio.base_events.Server | None = None

    async def start(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def wait(self, check: Any, timeout: float = 10) -> list[Span]:
        """Until `check(spans)` is true; the spans then."""
        async with asyncio.timeout(timeout):
            while not check(self.spans):
                await asyncio.sleep(0.02)
        return self.spans

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if lines[0].startswith("POST /v1/traces"):
                    self._take(body)
                    reply = ExportTraceServiceResponse().SerializeToString()
                    status = b"200 OK"
                else:
                    reply, status = b"", b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, len(reply), reply)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for s in scope.spans:
                    attributes = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append(
                        Span(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=s.kind,
                            attributes=attributes,
                            status_code=s.status.code,
                        )
                    )


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
