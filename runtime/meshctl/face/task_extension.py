"""MCP Tasks of the 2026-07-28 era: the extension `io.modelcontextprotocol/tasks` (SEP-2663), served
over the same detached calls as the 2025-11-25 Tasks (face/tasks.py).

In this era the server decides whether a `tools/call` becomes a task. The face's policy: a task when
the request's client capabilities (its `_meta` envelope) list the extension and the tool declares
`execution.taskSupport` `optional` or `required` (the bus's definition says it; this era's tool list
no longer carries the field, so it is the face's knowledge). Every other call is a plain one, a
`required` tool's included (the face holds a plain call to its deadline like any other), so a client
that did not declare the extension never gets a task it cannot read.

- `tools/call` -> a detached call on the bus (with answers when the client declared elicitation,
  sampling or roots), answered at once with `{"resultType": "task", taskId, status, ...}` (flat);
  the taskId is the bus task id.
- `tasks/get {taskId}` -> the record: its status, `inputRequests` while the tool asks (keyed by the
  ask's number), `result` (the CallToolResult) once completed, `error` (JSON-RPC) once failed.
- `tasks/update {taskId, inputResponses}` -> the answer to the ask waiting; keys that name no waiting
  ask are ignored, as the extension says. An empty result.
- `tasks/cancel {taskId}` -> the bus cancel (the child is told). An empty result.

Each request goes to the node under the face's identity and the request's person: a task outlives
the face that started it and is only its owner's. A middleware, as face/tasks.py: the `mcp` package
has no Tasks extension (its `Extension` API serves `MCPServer`, not the low-level Server), and a
middleware that answers owns its result's envelope, so `resultType` and the serverInfo stamp are put
here.
"""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types import methods as spec_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from runtime.client import AskRefused, CallError, TaskRecord
from runtime.meshctl.face.asking import checked_answer, client_request, declared
from runtime.meshctl.face.catalog import FaceTool
from runtime.meshctl.face.tasks import POLL_MS, iso, refusal, tool_of
from runtime.wire.identity import Person

log = logging.getLogger("mesh.face")

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"
_ALL_ASKS = {"elicitation", "sampling", "roots"}


def wants_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request's client listed the extension in its capabilities."""
    caps = ctx.session.client_capabilities
    return caps is not None and TASKS_EXTENSION in (caps.extensions or {})


def task_capable(tool: FaceTool) -> bool:
    execution = tool.definition.get("execution")
    return isinstance(execution, dict) and execution.get("taskSupport") in ("optional", "required")


def declares_tasks(meta: bytes) -> bool:
    """A cheap look at a request's raw `_meta` (the hot path's): may its client have declared the extension?
    A false yes only sends the call the package's way, where `wants_tasks` decides."""
    return CLIENT_CAPABILITIES_META_KEY.encode() in meta and TASKS_EXTENSION.encode() in meta


class TaskExtension:
    """The face's 2026-07-28 Tasks: a middleware for a task-capable tools/call and tasks/get, update, cancel."""

    def __init__(self, face: Any) -> None:
        self.face = face

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method, params = ctx.method, ctx.params if isinstance(ctx.params, dict) else {}
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await call_next(ctx)  # a 2025-11-25 session's Tasks are face/tasks.py's
        if method == "tools/call":
            tool = self._task_tool(ctx, params)
            return await call_next(ctx) if tool is None else await self._start(ctx, tool, params)
        if method not in METHODS:
            return await call_next(ctx)
        if not wants_tasks(ctx):
            required = types.ClientCapabilities(extensions={TASKS_EXTENSION: {}})
            data = types.MissingRequiredClientCapabilityErrorData(required_capabilities=required)
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message=f"{method} is the {TASKS_EXTENSION} extension's: list it in the request's client capabilities",
                data=data.model_dump(by_alias=True, mode="json", exclude_none=True),
            )
        task = params.get("taskId")
        if not isinstance(task, str) or not task:
            raise MCPError(code=INVALID_PARAMS, message=f"{method} needs params.taskId, the id tools/call gave")
        person = self.face.person_of(ctx)
        try:
            if method == "tasks/get":
                return self._stamped(await self._detailed(ctx, await self.face.client.task(task, person=person)))
            if method == "tasks/update":
                await self._update(task, params.get("inputResponses"), person)
            else:
                await self.face.client.cancel(task, person=person)  # the node checks it is the caller's
            return self._stamped({})
        except CallError as e:
            raise refusal(method, task, e) from None

    def _task_tool(self, ctx: ServerRequestContext[Any, Any], params: dict[str, Any]) -> FaceTool | None:
        """The tool of a call the policy makes a task; None for a call that goes the package's way."""
        if not wants_tasks(ctx) or params.get("requestState") is not None:
            return None  # (a retry with requestState answers face/asking.py's InputRequiredResult)
        name = params.get("name")
        tool = self.face.catalog.by_name.get(name) if isinstance(name, str) else None
        if tool is None or not task_capable(tool) or not isinstance(params.get("arguments") or {}, dict):
            return None  # the package's answer: a plain call, its "no tool named", its INVALID_PARAMS
        return tool

    async def _start(
        self, ctx: ServerRequestContext[Any, Any], tool: FaceTool, params: dict[str, Any]
    ) -> HandlerResult:
        face = self.face
        try:
            record = await face.client.start(
                tool.subject,
                params.get("arguments") or {},
                timeout_s=face.call_timeout_s,
                answers=bool(declared(ctx)),
                person=face.person_of(ctx),
            )
        except CallError as e:  # no task came of it: the error a plain call would answer
            return self._stamped(_call_result(ctx, face.error_result(e)))
        return self._stamped({"resultType": "task", **_task(record)})

    async def _detailed(self, ctx: ServerRequestContext[Any, Any], record: TaskRecord) -> dict[str, Any]:
        """The extension's DetailedTask of a record: the Task, and what its status carries."""
        face = self.face
        detailed = _task(record)
        if record.state == "input_required" and record.ask is not None:
            try:
                request = client_request(record.ask, _ALL_ASKS)
            except AskRefused as e:  # nothing a client could answer: the tool hears so at once, not at its deadline
                try:
                    await face.client.answer(record.ask, error=(e.code, e.message), person=face.person_of(ctx))
                except CallError as taken:  # refused meanwhile by another tasks/get, or the call ended
                    log.info("task %s: the refusal of ask %d was not taken: %s", record.task, record.ask.ask, taken)
                return {**detailed, "status": "working", "statusMessage": f"the tool's ask was refused: {e.message}"}
            dumped = request.model_dump(by_alias=True, mode="json", exclude_none=True)
            detailed["inputRequests"] = {str(record.ask.ask): dumped}
        elif record.state == "completed":
            result = face.checked_result(tool_of(face, record), await face.client.result_of(record))
            detailed["result"] = _call_result(ctx, result)
        elif record.state == "failed":
            error = record.error
            message = f"{error.code}: {error.message}" if error is not None else "the call failed"
            facts = {"mesh/error": {"code": error.code, "subject": record.subject}} if error is not None else {}
            detailed["error"] = {"code": INTERNAL_ERROR, "message": message[:1000], "data": facts}
        return detailed

    async def _update(self, task: str, responses: Any, person: Person | None) -> None:
        if not isinstance(responses, dict) or not all(isinstance(v, dict) for v in responses.values()):
            raise MCPError(
                code=INVALID_PARAMS,
                message="tasks/update needs params.inputResponses, an object of answers keyed as tasks/get's inputRequests",
            )
        record = await self.face.client.task(task, person=person)
        ask = record.ask
        if record.state != "input_required" or ask is None or str(ask.ask) not in responses:
            return  # answers to nothing waiting: ignored, as the extension says
        try:
            answer = checked_answer(ask.method, responses[str(ask.ask)])
        except AskRefused as e:
            raise MCPError(code=INVALID_PARAMS, message=f"inputResponses[{str(ask.ask)!r}]: {e.message}") from None
        try:
            await self.face.client.answer(ask, answer, person=person)
        except CallError as e:  # answered meanwhile, or the call ended: superseded, so ignored
            log.info("task %s: the answer to ask %d was not taken: %s", task, ask.ask, e)

    def _stamped(self, result: dict[str, Any]) -> dict[str, Any]:
        found = result.get("_meta")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        stamp = {SERVER_INFO_META_KEY: self.face.server.server_info_stamp}
        return {"resultType": "complete", **result, "_meta": {**meta, **stamp}}


def _task(record: TaskRecord) -> dict[str, Any]:
    """The extension's Task of a record (camelCase, as on the wire)."""
    task: dict[str, Any] = {
        "taskId": record.task,
        "status": record.state,
        "createdAt": iso(record.created_ms),
        "lastUpdatedAt": iso(record.updated_ms),
        "ttlMs": record.ttl_ms,
        "pollIntervalMs": POLL_MS,
    }
    if record.error is not None:
        task["statusMessage"] = record.error.message[:500]
    elif record.state == "input_required" and record.ask is not None:
        task["statusMessage"] = f"the tool asks ({record.ask.method}); answer it with tasks/update"
    return task


def _call_result(ctx: ServerRequestContext[Any, Any], result: Any) -> dict[str, Any]:
    """A CallToolResult as this revision has it (the package's sieve, as for a plain call's)."""
    dumped = result if isinstance(result, dict) else result.model_dump(by_alias=True, mode="json", exclude_none=True)
    try:
        shaped: dict[str, Any] = spec_methods.serialize_server_result("tools/call", ctx.protocol_version, dumped)
    except ValidationError as e:
        text = f"the tool's result is not a CallToolResult of {ctx.protocol_version}: {e.error_count()} problems"
        return {"content": [{"type": "text", "text": text}], "isError": True, "resultType": "complete"}
    return shaped
