"""The face: an MCP server (the `mcp` package's low-level Server) whose tools are the bus's.

`tools/list` is the catalog (paged, `page_size` a page); `tools/call` is a call through
`runtime.client.MeshClient` on the tool's subject: the client's cancel cancels the bus call (the
node sends the child `notifications/cancelled`), the child's progress comes back as the
client's progress, and a runtime error (404, 503, 504, 413, no responders) is a result with
`isError: true` carrying the node's message and ways out. The list follows the bus: a message
on `mesh.events.tools` (docs/mcp.md) makes the face ask every node again, and when what a
client sees changed, clients are told (`notifications/tools/list_changed` on a 2025-11-25
session, a `subscriptions/listen` event on the 2026-07-28 revision).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, TypedDict, cast

import anyio
import anyio.abc
import mcp_types as types
import msgspec
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from nats.aio.client import Client

from runtime.bus.catalog_watch import CatalogWatcher
from runtime.client import CallError, MeshClient
from runtime.client_tasks import AskHandler
from runtime.meshctl.face.asking import Asking, legacy_handler
from runtime.meshctl.face.auth import PERSON_KEY
from runtime.meshctl.face.catalog import Catalog, FaceTool
from runtime.meshctl.face.hot import HotPath
from runtime.meshctl.face.task_extension import TASKS_EXTENSION, TaskExtension
from runtime.meshctl.face.tasks import Tasks
from runtime.wire.callproto import ProgressFrame
from runtime.wire.identity import Person

log = logging.getLogger("mesh.face")

SERVER_NAME = "mesh"
PAGE_SIZE = 100  # tools per tools/list page
PROGRESS_KEPT = 64  # progress notifications waiting to go to a slow client; past it the newest are dropped
CALL_TIMEOUT_S = 600.0  # the face's own deadline on a call; each bundle's timeout_ms caps it lower

_decode_result = msgspec.json.Decoder(dict[str, Any]).decode
TASKS_CAPABILITY = types.ServerTasksCapability.model_validate(
    {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
)
CANCEL_REASON = "the MCP client cancelled the call"


class FaceServer(Server[Any]):
    """A low-level Server that says it sends tools/list_changed on every transport's handshake."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        options = super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )
        options.capabilities.tasks = TASKS_CAPABILITY  # face/tasks.py: task-augmented tools/call, tasks/*
        return options


def error_result(error: CallError) -> types.CallToolResult:
    """A runtime error as a tool result: the node's message, its ways out, its facts in _meta."""
    found = error.body.get("error")
    facts: dict[str, Any] = found if isinstance(found, dict) else {}
    kind = facts.get("kind") if isinstance(facts.get("kind"), str) else ""
    lines = [f"{error.code} {kind}: {error.message}".replace(" :", ":") if kind else f"{error.code}: {error.message}"]
    ways = facts.get("ways_out")
    if isinstance(ways, list) and ways:
        lines.append("ways out:")
        lines += [f"- {w}" for w in ways if isinstance(w, str)]
    tail = facts.get("stderr_tail")
    if isinstance(tail, list) and tail:
        lines.append("last lines of the tool's stderr:")
        lines += [f"  {t}" for t in tail[-10:] if isinstance(t, str)]
    return types.CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": "\n".join(lines)}],
            "isError": True,
            "_meta": {"mesh/error": {"code": error.code, "subject": error.subject, **facts}},
        }
    )


def _refused(text: str) -> types.CallToolResult:
    return types.CallToolResult.model_validate({"content": [{"type": "text", "text": text}], "isError": True})


class Face:
    """One face on one NATS connection; serves any number of MCP connections (stdio or HTTP)."""

    def __init__(
        self,
        nc: Client,
        catalog: Catalog,
        *,
        page_size: int = PAGE_SIZE,
        call_timeout_s: float = CALL_TIMEOUT_S,
        person: Person | None = None,
        state_keys: list[bytes] | None = None,
    ) -> None:
        self.nc, self.catalog = nc, catalog
        self.person = person  # who is behind every call of this face (stdio: the OS user who started it)
        self.page_size, self.call_timeout_s = page_size, call_timeout_s
        self.client = MeshClient(nc)
        self.events = InMemorySubscriptionBus()  # 2026-07-28 clients: subscriptions/listen streams
        # 2025-11-25 sessions, told of changes on their own channel; gone with their connection.
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        # The same connections by their Streamable HTTP session id: the hot path serves a session's calls.
        self.by_session_id: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._output_checks: dict[int, tuple[dict[str, Any], Any]] = {}  # id(definition) -> (it, its validator)
        # What every node serves, from the mesh-catalog bucket (runtime/bus/catalog_watch.py): read whole
        # once, then followed; a change costs its own entry, not a look at every node.
        self.watcher = CatalogWatcher(nc, on_change=self._catalog_changed)
        self.refreshed = 0  # how many times the list was rebuilt (tests wait on it)
        self.server = FaceServer(
            SERVER_NAME,
            version="0.1.0",
            instructions="Every tool served on the mesh's NATS bus. Names: <module>_<tool>, a seat's verb <seat>_<verb>.",
            on_list_tools=self._list_tools,
            # A handler may return the result as a dict (the SDK's runner dumps models and copies dicts);
            # its annotation asks for the model only.
            on_call_tool=cast(Any, self._call_tool),
            on_subscriptions_listen=ListenHandler(self.events, max_subscriptions=256, max_buffered_events=64),
            # The package checks a 2026-07-28 call's Mcp-Param headers against this schema (without it,
            # it would list every tool to find it, on every call).
            get_tool_input_schema=self._input_schema,
        )
        # The SDK's OpenTelemetry middleware opens a span per message even with no exporter; the face
        # is a hop on a hot path, and the node's own stats say what each call cost.
        self.server.middleware = [m for m in self.server.middleware if type(m).__name__ != "OpenTelemetryMiddleware"]
        self.server.middleware.append(self._remember_session)
        # A tool's asks as the client's (face/asking.py); 2026-07-28's requestState sealed by the package.
        self.asking = Asking(self)
        # MCP Tasks (face/tasks.py): a task-augmented tools/call and tasks/*, kept by the node, not here.
        self.server.middleware.append(Tasks(self))
        # ... and the 2026-07-28 era's Tasks extension (face/task_extension.py), advertised in server/discover.
        self.server.middleware.append(TaskExtension(self))
        self.server.extensions[TASKS_EXTENSION] = {}
        self.server.middleware.append(
            RequestStateBoundary(
                # One key for every worker of the face, or the operator's key file (face/state_key.py).
                RequestStateSecurity(keys=state_keys) if state_keys else RequestStateSecurity.ephemeral(),
                default_audience=SERVER_NAME,
            )
        )
        self.hot = HotPath(self)

    # --- the list -------------------------------------------------------------------------
    async def refresh(self) -> bool:
        """Read the catalogue whole now (`meshctl mcp --list`); tell clients when what they see changed."""
        await self.watcher.read_once()
        return await self._rebuild()

    async def _rebuild(self) -> bool:
        changed = self.catalog.rebuild(self.watcher.infos())
        self.refreshed += 1
        if self.watcher.absent and self.refreshed == 1:
            log.warning("no tools yet: %s", self.watcher.absent)
        if changed and self.refreshed > 1:
            log.info("tools changed: %d shown", len(self.catalog.tools))
            await self._tell_clients()
        return changed

    async def _catalog_changed(self, change: object) -> None:
        await self._rebuild()

    async def _tell_clients(self) -> None:
        await self.events.publish(ToolsListChanged())
        for connection in list(self._sessions):
            try:
                await connection.send_tool_list_changed()
            except Exception as e:  # a client that went away: nothing to tell it
                log.debug("list_changed not delivered: %s", e)

    async def watch(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the catalogue; runs until cancelled. Started once the first list is whole."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.watcher.run)
            await self._rebuild()
            task_status.started()

    async def _remember_session(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = ctx.session._connection
            self._sessions.add(connection)
            if isinstance(connection.session_id, str):
                self.by_session_id[connection.session_id] = connection
        return await call_next(ctx)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self.catalog.by_name.get(name)
        return tool.definition.get("inputSchema") if tool is not None else None

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return self.list_page(params.cursor if params is not None else None)

    def list_page(self, cursor: str | None) -> types.ListToolsResult:
        """The page after `cursor` (the package's way and the hot path's)."""
        tools = self.catalog.tools
        start = 0
        if cursor:
            # The cursor is the last name of the page before: a page never repeats or skips a tool
            # that stayed, even when the list changed in between.
            start = next((i for i, t in enumerate(tools) if t.name > cursor), len(tools))
        page = tools[start : start + self.page_size]
        more = start + self.page_size < len(tools)
        return types.ListToolsResult(
            tools=[types.Tool.model_validate(_with_meta(t)) for t in page],
            next_cursor=page[-1].name if more and page else None,
        )

    # --- calls ----------------------------------------------------------------------------
    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> dict[str, Any] | types.CallToolResult:
        tool = self.catalog.by_name.get(params.name)
        if tool is None:
            known = ", ".join(t.name for t in self.catalog.tools[:20])
            more = " ..." if len(self.catalog.tools) > 20 else ""
            return _refused(f"no tool named {params.name!r} on the mesh; tools/list shows them ({known}{more})")
        if not self.nc.is_connected:
            # A publish now would wait in the client's buffer for the reconnect: say so at once instead.
            return _refused(
                "503: the face is not connected to the bus (it keeps reconnecting); try again in a moment, "
                "or check the NATS server and `meshctl mcp --nats`"
            )
        person = self.person_of(ctx)
        asked = await self.asking.detached(ctx, tool, params, person)  # a 2026-07-28 client that answers asks
        if asked is not None:
            return cast(dict[str, Any], asked)
        # A 2025-11-25 session's client that answers a tool's asks gets them as the face's own requests,
        # on the same call as any other: its progress and trace context go on as they do without asks.
        on_ask = legacy_handler(ctx)
        if not (params.meta or {}).get("progress_token"):
            # The client asked for no progress: no forwarding task, no stream, no task group. The node is
            # still asked for progress, so its keepalives tell the face when it died mid-call.
            return await self._call_plain(tool, params.arguments, person, _trace_of(params), on_ask)
        send, receive = anyio.create_memory_object_stream[ProgressFrame](PROGRESS_KEPT)

        def on_progress(frame: ProgressFrame) -> None:
            try:
                send.send_nowait(frame)
            except anyio.WouldBlock:
                pass  # a client slower than the tool's progress misses some; the result still comes

        async def forward() -> None:
            async for frame in receive:
                await ctx.session.report_progress(frame.progress, frame.total, frame.message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(forward)
            try:
                data = await self.client.call(
                    tool.subject,
                    params.arguments or {},
                    timeout_s=self.call_timeout_s,
                    on_progress=on_progress,
                    cancel_reason=CANCEL_REASON,
                    person=person,
                    on_ask=on_ask,
                    **_trace_of(params),
                )
            except CallError as e:
                return error_result(e)
            finally:
                send.close()
        return self.checked_result(tool, data)

    def person_of(self, ctx: ServerRequestContext[Any, Any]) -> Person | None:
        """The person behind this request, passed to the node with its call (the node believes it only
        from a delegate): an HTTP request's token's (auth.py puts it in the request's scope), else the
        face's own (stdio: the OS user who started it)."""
        scope = getattr(ctx.request, "scope", None)
        person = scope.get(PERSON_KEY) if isinstance(scope, dict) else None
        return person if isinstance(person, Person) else self.person

    async def _call_plain(
        self,
        tool: FaceTool,
        arguments: dict[str, Any] | None,
        person: Person | None,
        trace: Trace | None = None,
        on_ask: AskHandler | None = None,
    ) -> dict[str, Any] | types.CallToolResult:
        try:
            data = await self.client.call(
                tool.subject,
                arguments or {},
                timeout_s=self.call_timeout_s,
                on_progress=_no_progress,
                cancel_reason=CANCEL_REASON,
                person=person,
                on_ask=on_ask,
                **(trace or Trace()),
            )
        except CallError as e:
            return error_result(e)
        return self.checked_result(tool, data)

    error_result = staticmethod(error_result)
    cancel_reason = CANCEL_REASON

    def checked_result(self, tool: FaceTool, data: bytes) -> dict[str, Any] | types.CallToolResult:
        """The tool's CallToolResult as it wrote it; a malformed one is said as an error, not passed on.

        Passed on as the decoded dict: the package validates a handler's result against the
        connection's protocol version on the way out anyway, so a pydantic model here would be
        validated, dumped and validated again. The check here is the shape (an object with a
        `content` list) and, for a tool with an `outputSchema`, its `structuredContent` against that
        schema (compiled once per definition); a result that passes and still breaks the
        revision's schema reaches the client as the package's INTERNAL_ERROR.
        """
        result = _shape_checked(tool, data)
        if isinstance(result, types.CallToolResult):
            return result
        schema = tool.definition.get("outputSchema")
        structured = result.get("structuredContent")
        if isinstance(schema, dict) and structured is not None and not result.get("isError"):
            problem = self._output_problem(tool, schema, structured)
            if problem is not None:
                return _refused(
                    f"{tool.subject}: the tool's structuredContent does not match its outputSchema: {problem}"[:2000]
                )
        return result

    def _output_problem(self, tool: FaceTool, schema: dict[str, Any], structured: Any) -> str | None:
        key = id(tool.definition)
        kept = self._output_checks.get(key)
        if kept is None or kept[0] is not tool.definition:
            try:
                from jsonschema.validators import validator_for  # type: ignore[import-untyped]

                kind = validator_for(schema)
                kind.check_schema(schema)
                validator: Any = kind(schema)
            except Exception as e:  # a schema the validator cannot compile: said, and not held against the result
                log.warning(
                    "%s: its outputSchema cannot be compiled (%s); results are not checked against it", tool.subject, e
                )
                validator = None
            if len(self._output_checks) > 4 * len(self.catalog.tools) + 64:
                self._output_checks.clear()
            kept = self._output_checks[key] = (tool.definition, validator)
        validator = kept[1]
        if validator is None:
            return None
        error = next(iter(validator.iter_errors(structured)), None)
        return (
            None
            if error is None
            else f"{error.message} (at {'/'.join(str(p) for p in error.absolute_path) or 'the top'})"
        )


def _no_progress(frame: ProgressFrame) -> None:
    """Progress of a call whose client asked for none: dropped here (the node's keepalives still count)."""


def _with_meta(tool: FaceTool) -> dict[str, Any]:
    meta = {"mesh/subject": tool.subject, "mesh/nodes": dict(zip(tool.nodes, tool.states))}
    return {**tool.definition, "_meta": meta}


def _shape_checked(tool: FaceTool, data: bytes) -> dict[str, Any] | types.CallToolResult:
    """The result decoded, if it is an object with a `content` list of typed items; else an error result."""
    try:
        result = _decode_result(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return _refused(f"{tool.subject}: the tool answered with something that is not JSON ({e})"[:2000])
    content = result.get("content")
    if not isinstance(content, list) or not all(
        isinstance(c, dict) and isinstance(c.get("type"), str) for c in content
    ):
        return _refused(
            f"{tool.subject}: the tool answered with something that is not a CallToolResult (no content list)"
        )
    # The model's defaults, which clients read: `isError` said outright, `resultType` (the sieve keeps or drops it).
    result.setdefault("isError", False)
    result.setdefault("resultType", "complete")
    return result


class Trace(TypedDict, total=False):
    traceparent: str
    tracestate: str


def _trace_of(params: types.CallToolRequestParams) -> Trace:
    """The MCP client's W3C trace context in the request's `_meta` (MCP 2026-07-28 carries it there),
    sent on as the call's NATS headers: the node's span continues the client's trace."""
    meta = params.meta
    if meta is None:
        return {}
    get = meta.get if isinstance(meta, dict) else (lambda key: getattr(meta, key, None))
    trace = Trace()
    if isinstance(parent := get("traceparent"), str):
        trace["traceparent"] = parent
    if isinstance(state := get("tracestate"), str):
        trace["tracestate"] = state
    return trace
