"""OpenTelemetry traces of calls across the bus: a call's span continues its caller's `traceparent`
and `tracestate` NATS headers, and the child gets the span's context in `params._meta`.

Configured by the standard environment only (`OTEL_TRACES_EXPORTER=otlp`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` = `http/protobuf` or `grpc`, `OTEL_SERVICE_NAME`, ...). Unset
(or `none`): `Tracing.from_environment` is None, the SDK is never imported, and the hot path pays one
`is None` test per call. Each node has a provider of its own (no global state), flushed at its stop.
"""

from __future__ import annotations

import contextvars
import logging
import os
from typing import Any, Mapping

from runtime.wire.callproto import TRACEPARENT, TRACESTATE

log = logging.getLogger("mesh.tracing")

MAX_HEADER = 512  # bytes of a traceparent or tracestate passed on; W3C's tracestate is at most 512

# The span a log line is written under (runtime/node/logs.py reads it): (trace id, span id) in hex.
CURRENT: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("mesh_trace", default=None)


class CallSpan:
    """One call's SERVER span, and its children: the wait (for a start or a slot) and the child's call."""

    __slots__ = ("_tracing", "span", "_wait", "ids")

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self._tracing = tracing
        self.span = span
        self._wait: Any = None
        ctx = span.get_span_context()
        self.ids = (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")

    def meta(self) -> bytes:
        """`"traceparent":"...","tracestate":"..."` for the child's `params._meta` (no braces)."""
        carrier: dict[str, str] = {}
        self._tracing.propagator.inject(carrier, context=self._tracing.trace.set_span_in_context(self.span))
        return b",".join(b'"%s":"%s"' % (k.encode(), v.encode()) for k, v in sorted(carrier.items()))

    def waiting(self, what: str) -> None:
        """The call waits (for its bundle's start, or a free slot) before it reaches the child."""
        if self._wait is None:
            ctx = self._tracing.trace.set_span_in_context(self.span)
            self._wait = self._tracing.tracer.start_span(f"wait {what}", context=ctx)

    def reached_child(self) -> None:
        if self._wait is not None:
            self._wait.end()
            self._wait = None

    def end(self, code: str, message: str = "") -> None:
        self.reached_child()
        span, status = self.span, self._tracing.status
        span.set_attribute("mesh.code", code)
        if code not in ("ok", "tool_error"):
            span.set_attribute("error.type", code)
            span.set_status(status.Status(status.StatusCode.ERROR, message[:256]))
        elif code == "tool_error":
            span.set_attribute("error.type", "tool_error")
        span.end()


class Tracing:
    """The node's tracer, made only when the environment asks for traces."""

    def __init__(self, provider: Any, node: str) -> None:
        from opentelemetry import trace  # lazy: only a node that exports traces loads the SDK
        from opentelemetry.trace import status  # lazy: as above
        from opentelemetry.trace.propagation.tracecontext import (  # lazy: as above
            TraceContextTextMapPropagator,
        )

        self.provider, self.node = provider, node
        self.trace, self.status = trace, status
        self.tracer = provider.get_tracer("mesh-node")
        self.propagator = TraceContextTextMapPropagator()
        self._server = trace.SpanKind.SERVER

    @classmethod
    def from_environment(cls, node: str, env: Mapping[str, str] | None = None) -> Tracing | None:
        env = os.environ if env is None else env
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        if exporter in ("", "none") or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
            return None
        if exporter != "otlp":
            log.warning("OTEL_TRACES_EXPORTER=%s: the node exports traces over otlp only; none are exported", exporter)
            return None
        return cls(_provider(node, env), node)

    def start(self, headers: Mapping[str, str] | None, subject: str, tool: str, module: str, bundle: str) -> CallSpan:
        """The SERVER span of a call, continuing its caller's trace when the headers carry one."""
        carrier = {}
        if headers:
            for key in (TRACEPARENT, TRACESTATE):
                value = headers.get(key)
                if value is not None and len(value) <= MAX_HEADER:
                    carrier[key] = value
        parent = self.propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"tools/call {tool}",
            context=parent,
            kind=self._server,
            attributes={
                "mcp.method.name": "tools/call",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "mesh.module": module,
                "mesh.bundle": bundle,
                "mesh.node": self.node,
            },
        )
        return CallSpan(self, span)

    def shutdown(self) -> None:
        """Export what is left (a stop): the batch processor's queue is flushed, within its timeout."""
        try:
            self.provider.shutdown()
        except Exception as e:  # a collector out of reach: the node stops anyway
            log.warning("traces not flushed at stop: %s", e)


def _provider(node: str, env: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import Resource  # lazy: as above
    from opentelemetry.sdk.trace import TracerProvider  # lazy: as above
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # lazy: as above

    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # lazy: as above
    else:
        if protocol not in ("", "http/protobuf"):
            log.warning(
                "OTEL_EXPORTER_OTLP_PROTOCOL=%s: the node speaks http/protobuf or grpc; using http/protobuf", protocol
            )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]  # lazy: as above
            OTLPSpanExporter,
        )
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "mesh-node", "mesh.node": node})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("traces: OTLP over %s to %s", protocol or "http/protobuf", _endpoint(env))
    return provider


def _endpoint(env: Mapping[str, str]) -> str:
    return env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "(the default)"
