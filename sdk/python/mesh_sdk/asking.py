"""Asking the caller mid-call: an elicitation that reaches the caller of this call across the mesh.

The node passes a child's `elicitation/create` to the caller of the call it belongs to (docs/bus.md,
"Asking"). With several calls in flight on one child the node must know which: every `tools/call`
of a caller that answers carries `_meta["mesh/call"]`, and these helpers copy it onto the request
(sdk/COMMON.md, "Asking"). A caller that cannot answer makes the request fail at once with a
JSON-RPC error (an `MCPError` here), never a hang.
"""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel

from .call import _meta

CALL_REF_KEY = "mesh/call"  # the call reference the node puts in a tools/call's _meta


def _ref(ctx: Context[Any, Any]) -> dict[str, Any] | None:
    ref = _meta(ctx).get(CALL_REF_KEY)
    return {CALL_REF_KEY: ref} if isinstance(ref, int) and not isinstance(ref, bool) else None


async def elicit(
    ctx: Context[Any, Any], message: str, schema: type[BaseModel] | dict[str, Any]
) -> types.ElicitResult:
    """Ask the caller to fill a form (`schema`: a pydantic model of primitive fields, or a JSON schema
    object); the result's `action` is accept, decline or cancel, `content` the answer when accepted."""
    requested = schema if isinstance(schema, dict) else render_elicitation_schema(schema)
    params = types.ElicitRequestFormParams(message=message, requested_schema=requested, _meta=_ref(ctx))
    return await _send(ctx, params)


async def elicit_url(ctx: Context[Any, Any], message: str, url: str, elicitation_id: str) -> types.ElicitResult:
    """Send the caller's user to `url` (URL mode: what happens there never passes the mesh)."""
    params = types.ElicitRequestURLParams(message=message, url=url, elicitation_id=elicitation_id, _meta=_ref(ctx))
    return await _send(ctx, params)


async def _send(
    ctx: Context[Any, Any], params: types.ElicitRequestFormParams | types.ElicitRequestURLParams
) -> types.ElicitResult:
    request = types.ElicitRequest(params=params)
    metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
    return await ctx.request_context.session.send_request(request, types.ElicitResult, metadata=metadata)
