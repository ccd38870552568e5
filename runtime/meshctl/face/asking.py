"""A tool's ask, as the MCP client's: elicitation (and sampling, roots) through `meshctl mcp`.

A tool on the mesh asks its caller (docs/bus.md, "Asking"); through the face the caller is the MCP
client, in its era:

- 2025-11-25 (a session): the face calls with an ask handler; each ask becomes the face's own
  `elicitation/create` (or `sampling/createMessage`, `roots/list`) to the client, related to the
  client's `tools/call`, and the client's answer goes back to the tool. Only what the client
  declared in its capabilities is asked; anything else the tool learns is refused, at once.
- 2026-07-28 (stateless): the call is a detached one (its task keeps it while the client is away);
  an ask becomes an `InputRequiredResult` whose `requestState` names the task and the ask, sealed
  by the package's `RequestStateBoundary` (AES-GCM under the face's key: a client can neither read
  nor forge it), and the client's retry with `inputResponses` answers it and waits on. The task is
  the person's own (the node checks), so even a state from another face names nothing of anyone else.
- A client that declared none of it: the face calls as before (no Mesh-Answers), and the tool sees
  at once that its caller cannot answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from runtime.client import AskFrame, AskRefused, CallError, TaskRecord
from runtime.client_tasks import AskHandler, ask_text
from runtime.meshctl.face.catalog import FaceTool
from runtime.wire.identity import Person

log = logging.getLogger("mesh.face")

# What each ask method needs the client to have declared, and its request and result types.
_ASKS: dict[str, tuple[str, type[Any], type[Any]]] = {
    "elicitation/create": ("elicitation", types.ElicitRequest, types.ElicitResult),
    "sampling/createMessage": ("sampling", types.CreateMessageRequest, types.CreateMessageResult),
    "roots/list": ("roots", types.ListRootsRequest, types.ListRootsResult),
}


def declared(ctx: ServerRequestContext[Any, Any]) -> set[str]:
    """The ask capabilities the client declared (elicitation, sampling, roots)."""
    caps = ctx.session.client_capabilities
    if caps is None:
        return set()
    return {name for name in ("elicitation", "sampling", "roots") if getattr(caps, name, None) is not None}


def client_request(frame: AskFrame, can: set[str]) -> Any:
    """The tool's ask as the MCP request to the client; AskRefused when the client cannot take it."""
    found = _ASKS.get(frame.method)
    if found is None or found[0] not in can:
        raise AskRefused(f"the MCP client of this call did not declare {found[0] if found else frame.method}", -32601)
    params = {k: v for k, v in ask_text(frame).items() if k != "_meta"}  # the mesh's call reference stays here
    try:
        return found[1].model_validate({"method": frame.method, "params": params})
    except ValidationError as e:
        raise AskRefused(
            f"{frame.method}: not a request the MCP client takes: {e.error_count()} problems", -32602
        ) from None


def checked_answer(method: str, answer: dict[str, Any]) -> dict[str, Any]:
    """A client's answer to an ask, checked as the ask method's result; AskRefused when it is not one."""
    found = _ASKS.get(method)
    if found is None:
        raise AskRefused(f"{method} is not an ask the face passes on", -32601)
    try:
        result = found[2].model_validate(answer)
    except ValidationError as e:
        raise AskRefused(f"not a {found[2].__name__}: {e.error_count()} problems", -32602) from None
    checked: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return checked


def legacy_handler(ctx: ServerRequestContext[Any, Any]) -> AskHandler | None:
    """The ask handler of a 2025-11-25 session whose client declared something to ask; else None."""
    can = declared(ctx)
    if not can or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None

    async def on_ask(frame: AskFrame) -> dict[str, Any]:
        request = client_request(frame, can)
        result_type = _ASKS[frame.method][2]
        metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
        try:
            result = await ctx.session.send_request(request, result_type, metadata=metadata)
        except Exception as e:  # the client's own error, or the client went away
            raise AskRefused(f"the MCP client answered with an error: {e}"[:1000], getattr(e, "code", -32603)) from None
        answer: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return answer

    return on_ask


class Asking:
    """The face's detached calls of the 2026-07-28 era, asked through InputRequiredResult. (A 2025-11-25
    session's asks need no class: its call is the face's usual one with `legacy_handler`'s handler.)"""

    def __init__(self, face: Any) -> None:
        self.face = face

    async def detached(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: FaceTool,
        params: types.CallToolRequestParams,
        person: Person | None,
    ) -> Any:
        """A 2026-07-28 call whose client answers asks (or a retry with their answers); None for any other."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        if params.request_state is not None:
            return await self._resume(ctx, tool, params, person)
        if not declared(ctx):
            return None
        face = self.face
        try:
            record = await face.client.start(
                tool.subject, params.arguments or {}, timeout_s=face.call_timeout_s, answers=True, person=person
            )
        except CallError as e:
            return face.error_result(e)
        return await self._until_asked(tool, record.task, person)

    async def _until_asked(self, tool: FaceTool, task: str, person: Person | None) -> Any:
        """The detached call's end (its result), or its next ask as an InputRequiredResult."""
        face = self.face
        record: TaskRecord | None = None
        try:
            record = await face.client.task_result(task, wait_s=face.call_timeout_s, person=person)
            if record.state == "input_required" and record.ask is not None:
                return _input_required(record, record.ask)
            return face.checked_result(tool, await face.client.result_of(record))
        except CallError as e:
            return face.error_result(e)
        except Exception as e:  # TaskFailed: the record says why
            return _failed(tool, record, e)

    async def _resume(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: FaceTool,
        params: types.CallToolRequestParams,
        person: Person | None,
    ) -> Any:
        """A 2026-07-28 retry: its answers to the task's ask, then the wait goes on."""
        try:
            state = json.loads(params.request_state or "")
            task, n = str(state["task"]), int(state["ask"])
        except (ValueError, KeyError, TypeError):
            return _refused("requestState is not one this face made; call the tool again without it")
        face = self.face
        try:
            record = await face.client.task(task, person=person)
        except CallError as e:
            return face.error_result(e)
        if record.state == "input_required" and record.ask is not None and record.ask.ask == n:
            response = (params.input_responses or {}).get(str(n))
            if response is None:
                return _input_required(record, record.ask)  # retried without the answer: asked again
            answer = response.model_dump(by_alias=True, mode="json", exclude_none=True)
            try:
                await face.client.answer(record.ask, answer, person=person)
            except CallError as e:
                log.info("task %s: the answer to ask %d was not taken: %s", task, n, e)
        return await self._until_asked(tool, task, person)


def _input_required(record: TaskRecord, ask: AskFrame) -> Any:
    try:
        request = client_request(ask, {"elicitation", "sampling", "roots"})
    except AskRefused as e:
        return _refused(f"the tool asked what this face cannot pass on: {e.message}")
    state = json.dumps({"task": record.task, "ask": ask.ask})
    return types.InputRequiredResult(input_requests={str(ask.ask): request}, request_state=state)


def _failed(tool: FaceTool, record: TaskRecord | None, e: Exception) -> Any:
    return _refused(f"{tool.subject}: {e}")


def _refused(text: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate({"content": [{"type": "text", "text": text}], "isError": True})
