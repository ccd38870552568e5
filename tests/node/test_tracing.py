"""Traces of calls across the bus, exported over OTLP/HTTP to a real receiver in the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder
from tests.support.otlp import Receiver

SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    yield r
    await r.close()


async def test_a_calls_span_continues_the_callers_trace_and_the_child_joins_it(
    tmp_path: Path, m: Mesh, script: Script, receiver: Receiver
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    headers = {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "mesh=t1"}
    result, code = await m.call("mesh.tool.alpha.greet", {"name": "Ada"}, headers=headers)
    assert code is None and "greet" in json.dumps(result)
    spans = await receiver.wait(lambda s: any(x.name == "tools/call greet" for x in s))
    [span] = [s for s in spans if s.name == "tools/call greet"]
    assert (span.trace_id, span.parent_span_id, span.kind) == (TRACE, PARENT, SERVER)
    assert span.attributes["gen_ai.tool.name"] == "greet" and span.attributes["mcp.method.name"] == "tools/call"
    assert span.attributes["mesh.module"] == "alpha" and span.attributes["mesh.node"] == "n1"
    assert span.attributes["mesh.code"] == "ok"
    [call] = [r for r in script.started[-1].received if r.get("method") == "tools/call"]
    meta = call["params"]["_meta"]
    assert meta["traceparent"].split("-")[1:3] == [TRACE, span.span_id]  # the child's parent is the call's span
    assert meta["tracestate"] == "mesh=t1" and "mesh/caller" in meta


async def test_a_503_and_a_504_are_spans_with_their_code(
    tmp_path: Path, m: Mesh, script: Script, receiver: Receiver
) -> None:
    script.modules["slow"] = [Behaviour(answer=echo, call_seconds=5)]
    script.modules["broken"] = [Behaviour(unstartable=True)]
    await m.start("n1", module_folder(tmp_path, "slow", timeout_ms=150), module_folder(tmp_path, "broken"))
    await m.bundle_state("n1", "broken/tools", "failed")
    assert (await m.call("mesh.tool.slow.greet", {}))[1] == "504"
    assert (await m.call("mesh.tool.broken.greet", {}))[1] == "503"
    spans = await receiver.wait(lambda s: {x.attributes.get("mesh.code") for x in s} >= {"503", "504"})
    by_code = {s.attributes["mesh.code"]: s for s in spans if "mesh.code" in s.attributes}
    assert by_code["504"].attributes["error.type"] == "504" and by_code["504"].status_code == 2  # STATUS_CODE_ERROR
    assert by_code["503"].attributes["error.type"] == "503"
    assert len({s.trace_id for s in by_code.values()}) == 2  # no caller context: each call a trace of its own


async def test_without_the_environment_nothing_is_traced_and_the_child_gets_no_trace(
    tmp_path: Path, m: Mesh, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    node = await m.start("n1", module_folder(tmp_path, "alpha"))
    assert node.serving is not None and node.serving.dispatcher.tracing is None
    await m.call("mesh.tool.alpha.greet", {}, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
    [call] = [r for r in script.started[-1].received if r.get("method") == "tools/call"]
    assert "traceparent" not in call["params"].get("_meta", {})


async def test_the_python_caller_continues_a_trace_it_is_given_and_starts_one_otherwise(
    tmp_path: Path, m: Mesh, script: Script, receiver: Receiver
) -> None:
    from runtime.client import MeshClient
    from runtime.wire.callproto import valid_traceparent

    await m.start("n1", module_folder(tmp_path, "alpha"))
    caller = MeshClient(m.nc)
    await caller.call("mesh.tool.alpha.greet", {}, traceparent=f"00-{TRACE}-{PARENT}-01")
    spans = await receiver.wait(lambda s: any(x.trace_id == TRACE for x in s))
    assert [s.parent_span_id for s in spans if s.trace_id == TRACE and s.kind == SERVER] == [PARENT]

    seen: list[dict[str, str]] = []

    async def record(msg: Any) -> None:
        seen.append(dict(msg.headers or {}))
        await msg.respond(b'{"content": []}')

    await m.nc.subscribe("mesh.tool.recorder.t", cb=record)
    await caller.call("mesh.tool.recorder.t", {})
    await caller.call("mesh.tool.recorder.t", {})
    assert all(valid_traceparent(h["traceparent"]) for h in seen), seen
    assert seen[0]["traceparent"].split("-")[1] != seen[1]["traceparent"].split("-")[1]  # a trace each
    await caller.close()
