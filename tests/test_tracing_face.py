"""A trace from an MCP client through `meshctl mcp`, the bus and the node into the tool (issue 27):
the client's `_meta.traceparent` reaches the child, and the node's span continues it. A real node
exporting over OTLP/HTTP to a receiver in this test, a real face over stdio, raw JSON-RPC."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.support.face import face_command
from tests.support.mesh import ROOT, NatsServer, NodeProcess, make_module
from tests.support.otlp import Receiver
from tests.support.stdio_client import StdioClient

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


async def test_an_mcp_clients_traceparent_reaches_the_child_through_the_face(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    receiver = await Receiver().start()
    make_module(tmp_path / "mods", "traced")
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    node = NodeProcess(tmp_path, tmp_path / "mods", nats_server.url, "traced-n1", env=env)
    face = None
    try:
        node.wait_log("serving on", timeout=30)
        face = StdioClient(face_command(nats_server.url), cwd=ROOT)
        await asyncio.to_thread(face.initialize)

        def meta_seen(progress: bool) -> dict[str, object]:
            meta: dict[str, object] = {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "client=1"}
            if progress:
                meta["progressToken"] = "p1"  # the mcp package's way through the face, not the hot path
            result = face.call("traced_meta", {}, meta=meta)
            assert not result.get("isError"), result
            return json.loads(result["content"][0]["text"])

        for progress in (False, True):
            seen = await asyncio.to_thread(meta_seen, progress)
            assert isinstance(seen["traceparent"], str) and seen["traceparent"].split("-")[1] == TRACE, seen
            assert seen["tracestate"] == "client=1"
        spans = await receiver.wait(lambda s: len([x for x in s if x.trace_id == TRACE]) >= 2)
        served = [s for s in spans if s.trace_id == TRACE and s.name == "tools/call meta"]
        assert [s.parent_span_id for s in served] == [PARENT, PARENT], served
    finally:
        if face is not None:
            face.close()
        node.kill()
        await receiver.close()
