"""One tool whose input schema uses JSON Schema 2020-12 keywords (`$schema`, `$defs`, `$ref`), as
the conformance suite's json-schema-2020-12 scenario asks; the face must pass it on unchanged.
A plain stdio MCP server (the SDK derives schemas from type hints, this one is written out)."""

import json
import sys

TOOL = {
    "name": "schema_2020_12_tool",
    "description": "Tool with JSON Schema 2020-12 features",
    "inputSchema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}
        },
        "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
        "additionalProperties": False,
    },
}


def answer(rid: object, result: dict) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue  # notifications: initialized, cancelled
    if method == "initialize":
        version = msg.get("params", {}).get("protocolVersion", "2025-11-25")
        answer(rid, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "json", "version": "0.1.0"}})
    elif method == "tools/list":
        answer(rid, {"tools": [TOOL]})
    elif method == "tools/call":
        args = msg.get("params", {}).get("arguments") or {}
        answer(rid, {"content": [{"type": "text", "text": json.dumps(args)}], "isError": False})
    elif method == "ping":
        answer(rid, {})
    else:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}}) + "\n")
        sys.stdout.flush()
