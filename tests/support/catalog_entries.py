"""A fake node's entries in the mesh-catalog bucket, for tests whose node is a bus responder:
its record, its beat, one bundle's state and its definitions, as runtime/node/catalog.py writes them."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
from nats.aio.client import Client

from runtime.bus.catalog import open_bucket
from runtime.wire.catalog import (
    BeatRecord,
    NodeRecord,
    StateRecord,
    ToolDef,
    beat_key,
    defs_key,
    encode,
    node_key,
    split_definitions,
    state_key,
)


async def write_node(
    nc: Client, tools: dict[str, dict[str, Any]], *, node: str = "n1", module: str = "m", bundle: str = "tools"
) -> None:
    """Catalogue `tools` (name -> MCP definition) as served on `mesh.tool.<module>.<name>` by `node`."""
    js = nc.jetstream()
    await open_bucket(js)
    kv = await js.key_value("mesh-catalog")
    defs = [
        ToolDef(f"mesh.tool.{module}.{name}", "tool", name, msgspec.Raw(json.dumps(d).encode()))
        for name, d in tools.items()
    ]
    split = split_definitions(module, bundle, defs)
    for i, part in enumerate(split.parts):
        await kv.put(defs_key(node, module, bundle, split.digest, i), part)
    state = StateRecord(module, bundle, "1.0.0", "ready", split.digest, len(split.parts), split.tools)
    await kv.put(state_key(node, module, bundle), encode(state))
    record = NodeRecord(node, "run-1", f"service-{node}", 5.0, 15.0, time.time(), bundles=[f"{module}/{bundle}"])
    await kv.put(node_key(node), encode(record))
    await kv.put(beat_key(node), encode(BeatRecord("run-1")))
