"""MCP Tasks through `meshctl mcp`: a task-augmented `tools/call` is a detached call on the bus.

The task's id is the call's id, and its state lives on the bus (the node's mesh-tasks bucket,
docs/bus.md, "Detached calls"), not in the face: any face of the same caller reads it, and a face
restarted in between finds it. Every request goes to the node under the face's own identity and
the person behind it, so a task is visible only to whoever made it (the node keys records by their
owner): `tasks/get` -> the record, `tasks/result` -> its result once it ends (each request waits at
most 60 s), `tasks/list` -> the caller's tasks a page at a time, `tasks/cancel` -> checks the task is
the caller's, then cancels it in the child.

A middleware (the package has no Tasks handlers): it answers these methods itself and leaves
everything else to the package. The 2025-11-25 era only: 2026-07-28 moved Tasks to an extension
(`io.modelcontextprotocol/tasks`, SEP-2663) with another wire (a server-decided task, `tasks/update`,
no `tasks/list`, the result inside `tasks/get`), served by face/task_extension.py over the same
detached calls; such a request passes this middleware by (its legacy `params.task` is ignored, as
that era says).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from runtime.client import CallError, NodeRefused, TaskRecord
from runtime.wire.asking import MAX_WAIT_MS, TERMINAL

log = logging.getLogger("mesh.face")

POLL_MS = 1000  # what a task tells its client to wait between tasks/get
TASK_METHODS = ("tasks/get", "tasks/result", "tasks/list", "tasks/cancel")


def iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).isoformat().replace("+00:00", "Z")


def task_of(record: TaskRecord) -> dict[str, Any]:
    """The MCP Task of a record (camelCase, as on the wire)."""
    task: dict[str, Any] = {
        "taskId": record.task,
        "status": record.state,
        "createdAt": iso(record.created_ms),
        "lastUpdatedAt": iso(record.updated_ms),
        "ttl": record.ttl_ms,
        "pollInterval": POLL_MS,
    }
    if record.error is not None:
        task["statusMessage"] = record.error.message[:500]
    elif record.state == "input_required" and record.ask is not None:
        task["statusMessage"] = f"the tool asks ({record.ask.method}); answer it with tasks/result"
    return task


def refusal(method: str, task: object, e: CallError) -> MCPError:
    """The JSON-RPC error of a task request the node refused (both eras')."""
    if isinstance(e, NodeRefused) and e.code == 404:
        return MCPError(code=INVALID_PARAMS, message=f"no task {str(task)[:64]!r} of yours")
    if isinstance(e, NodeRefused) and e.code == 400:  # the node judged the request's fields: the client's to fix
        return MCPError(code=INVALID_PARAMS, message=f"{method}: {e.message}"[:1000])
    return MCPError(code=INTERNAL_ERROR, message=f"{method}: {e.code} {e.message}"[:1000])


class Tasks:
    """The face's MCP Tasks: a middleware for tools/call with `task` and the tasks/* methods."""

    def __init__(self, face: Any) -> None:
        self.face = face

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method, params = ctx.method, ctx.params or {}
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await call_next(ctx)
        if method == "tools/call" and isinstance(params, dict) and params.get("task") is not None:
            return await self._start(ctx, params)
        if method not in TASK_METHODS:
            return await call_next(ctx)
        person = self.face.person_of(ctx)
        try:
            if method == "tasks/list":
                cursor = params.get("cursor") if isinstance(params.get("cursor"), str) else None
                page = await self.face.client.tasks(cursor, person=person)
                listed: dict[str, Any] = {"tasks": [task_of(r) for r in page.tasks]}
                if page.next_cursor:
                    listed["nextCursor"] = page.next_cursor
                return listed
            task = params.get("taskId")
            if not isinstance(task, str) or not task:
                raise MCPError(code=INVALID_PARAMS, message=f"{method} needs params.taskId, the id tools/call gave")
            if method == "tasks/get":
                return task_of(await self.face.client.task(task, person=person))
            if method == "tasks/cancel":
                await self.face.client.task(task, person=person)  # the caller's own, or 404: nothing is cancelled
                return task_of(await self.face.client.cancel(task, person=person))
            return await self._result(task, person)
        except CallError as e:
            raise refusal(method, params.get("taskId"), e) from None

    async def _start(self, ctx: ServerRequestContext[Any, Any], params: dict[str, Any]) -> HandlerResult:
        face = self.face
        name = params.get("name")
        tool = face.catalog.by_name.get(name) if isinstance(name, str) else None
        if tool is None:
            raise MCPError(
                code=INVALID_PARAMS, message=f"no tool named {str(name)[:64]!r} on the mesh; tools/list shows them"
            )
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise MCPError(code=INVALID_PARAMS, message="params.arguments must be an object")
        try:
            record = await face.client.start(
                tool.subject, arguments, timeout_s=face.call_timeout_s, person=face.person_of(ctx)
            )
        except CallError as e:
            raise MCPError(
                code=INTERNAL_ERROR, message=f"the task did not start: {e.code} {e.message}"[:1000]
            ) from None
        return {"task": task_of(record)}

    async def _result(self, task: str, person: Any) -> HandlerResult:
        face = self.face
        record = await face.client.task_result(task, wait_s=MAX_WAIT_MS / 1000, person=person)
        if record.state not in TERMINAL:
            raise MCPError(
                code=INTERNAL_ERROR,
                message=f"task {task} is still {record.state} after {MAX_WAIT_MS // 1000} s; ask tasks/result again",
            )
        related = {"io.modelcontextprotocol/related-task": {"taskId": task}}
        if record.state == "completed":
            result = face.checked_result(tool_of(face, record), await face.client.result_of(record))
            shaped = (
                result if isinstance(result, dict) else result.model_dump(by_alias=True, mode="json", exclude_none=True)
            )
        else:
            why = record.error.message if record.error is not None else "cancelled"
            shaped = {"content": [{"type": "text", "text": f"task {task} {record.state}: {why}"}], "isError": True}
        return {**shaped, "_meta": {**(shaped.get("_meta") or {}), **related}}


class _Unlisted:
    """A tool a record names that the face's list has not (its subject only): results are checked as plain ones."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.definition: dict[str, Any] = {}


def tool_of(face: Any, record: TaskRecord) -> Any:
    for tool in face.catalog.tools:
        if tool.subject == record.subject:
            return tool
    return _Unlisted(record.subject)
