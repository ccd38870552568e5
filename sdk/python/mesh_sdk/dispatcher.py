"""The `mcp` library's `Dispatcher` seam, implemented for JSON-RPC lines over the node's pipes.

The library layers a server as: transport (bytes) -> `Dispatcher` (JSON-RPC ids, a task per
request, cancellation, progress; "deliberately not MCP-aware") -> the MCP type layer
(`ServerRunner`: per-revision validation, sessions, `Context`, handlers). This module is the
middle layer for one transport, the node's stdin/stdout; the type layer above and the message
models below stay the library's.

Why not the library's own `JSONRPCDispatcher`: it speaks to any transport through
`SessionMessage` streams and wraps every answer in a response model, which together cost about
as much CPU as the MCP type layer itself (docs/performance.md, "The Python SDK child"). Here a
request is parsed once by the library's message adapter (in `stdio.PipeReader`), runs in its
own task, and its answer is written to the pipe as one JSON line.

The behaviour is the library's dispatcher's, point by point: `initialize` runs inline (the read
loop waits for it); `notifications/cancelled` cancels the request's scope and the request is
never answered; a handler's `MCPError` is its error, a pydantic `ValidationError` is
INVALID_PARAMS, anything else is code 0 with its message (and logged); requests still running
when stdin closes are answered CONNECTION_CLOSED; requests the server sends (elicitation,
sampling, roots) are matched to their answers by id, with progress, a timeout and a courtesy
`notifications/cancelled` when abandoned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
from mcp.shared.dispatcher import (
    CallOptions,
    OnNotify,
    OnNotifyIntercept,
    OnRequest,
    ProgressFnT,
    coerce_request_id,
    run_notify_intercept,
)
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import (
    cancelled_request_id_from_params,
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
)
from pydantic_core import to_json

from .stdio import PipeReader, PipeWriter

_log = logging.getLogger("mesh_sdk.dispatcher")

# One last answer on the way out (shutdown, abandoned request) may wait this long for the pipe.
FINAL_WRITE_TIMEOUT_S = 1.0
_TRANSPORT = TransportContext(kind="jsonrpc", can_send_request=True)
_CLOSED = ErrorData(code=CONNECTION_CLOSED, message="Connection closed")


class _Context:
    """The library's `DispatchContext` for one inbound message: its id, its back-channel, its cancel."""

    __slots__ = ("_dispatcher", "_request_id", "_progress_token", "_closed", "_cancel")

    transport = _TRANSPORT
    message_metadata = None  # the node's pipes attach none (the library's stdio neither)

    def __init__(self, dispatcher: PipeDispatcher, request_id: RequestId | None, progress_token: Any = None) -> None:
        self._dispatcher = dispatcher
        self._request_id = request_id
        self._progress_token = progress_token
        self._closed = False
        self._cancel: anyio.Event | None = None  # made when somebody looks: most calls are never cancelled

    @property
    def request_id(self) -> RequestId | None:
        return self._request_id

    @property
    def can_send_request(self) -> bool:
        return not self._closed

    @property
    def cancel_requested(self) -> anyio.Event:
        if self._cancel is None:
            self._cancel = anyio.Event()
        return self._cancel

    @property
    def was_cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if self._closed:
            _log.debug("dropped %s: its request is finished", method)
            return
        await self._dispatcher.notify(method, params, opts)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        if self._closed:
            raise NoBackChannelError(method)
        return await self._dispatcher.send_raw_request(method, params, opts)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self._progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self._progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)


class _Pending:
    """A request this server sent, waiting for the node's answer."""

    __slots__ = ("done", "outcome", "on_progress")

    def __init__(self, on_progress: ProgressFnT | None) -> None:
        self.done = anyio.Event()
        self.outcome: dict[str, Any] | ErrorData = _CLOSED
        self.on_progress = on_progress


class PipeDispatcher:
    """JSON-RPC over the node's pipes, for the library's `ServerRunner` (its `Dispatcher` protocol)."""

    def __init__(self, read: PipeReader, write: PipeWriter, *, inline_methods: frozenset[str] = frozenset()) -> None:
        self._read = read
        self._write = write
        self._inline = inline_methods
        self._in_flight: dict[RequestId, tuple[anyio.CancelScope, _Context]] = {}
        self._pending: dict[RequestId, _Pending] = {}
        self._next_id = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._calls: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._running = False
        self._closed = False

    # --- inbound ----------------------------------------------------------------------------

    async def run(
        self,
        on_request: OnRequest,
        on_notify: OnNotify,
        on_notify_intercept: OnNotifyIntercept | None = None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read the pipe until stdin closes; each request runs in its own task, owned here."""
        try:
            async with anyio.create_task_group() as tg:  # notification handlers, progress callbacks
                self._tg, self._running = tg, True
                task_status.started()
                async for item in self._read:
                    if isinstance(item, Exception):  # not a JSON-RPC message: dropped, as the library does
                        _log.debug("dropped a line that is not a JSON-RPC message: %r", item)
                        continue
                    message = item.message
                    if isinstance(message, JSONRPCRequest):
                        await self._request(message, on_request)
                    elif isinstance(message, JSONRPCNotification):
                        self._notification(message, on_notify, on_notify_intercept)
                    elif isinstance(message, JSONRPCResponse):
                        self._resolve(message.id, message.result)
                    elif isinstance(message, JSONRPCError):
                        self._resolve(message.id, message.error)
                self._close()
                tg.cancel_scope.cancel()  # stdin closed: nobody waits for what is still running
        finally:
            self._close()
            await self._stop_calls()

    async def _request(self, request: JSONRPCRequest, on_request: OnRequest) -> None:
        ctx = _Context(self, request.id, progress_token_from_params(request.params))
        scope = anyio.CancelScope()
        self._in_flight[coerce_request_id(request.id)] = (scope, ctx)
        if request.method in self._inline:
            await self._handle(request, ctx, scope, on_request)  # the read loop waits (initialize)
            return
        # A bare asyncio task per call, owned by `_calls` and stopped by `_stop_calls`: anyio's
        # task-group spawn cost about an eighth of a call's CPU here (docs/performance.md).
        task = asyncio.get_running_loop().create_task(self._handle(request, ctx, scope, on_request))
        self._calls[task] = scope
        task.add_done_callback(self._calls.pop)

    async def _stop_calls(self) -> None:
        """Cancel the calls still running and wait (bounded) until each has said so to the node."""
        for scope in self._calls.values():
            scope.cancel()
        if self._calls:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(list(self._calls), timeout=2 * FINAL_WRITE_TIMEOUT_S)

    async def _handle(
        self, request: JSONRPCRequest, ctx: _Context, scope: anyio.CancelScope, on_request: OnRequest
    ) -> None:
        answered = False
        try:
            with scope:
                try:
                    result = await on_request(ctx, request.method, request.params)
                finally:
                    ctx._closed = True
                    key = coerce_request_id(request.id)
                    if (entry := self._in_flight.get(key)) is not None and entry[1] is ctx:
                        del self._in_flight[key]
                if not ctx.was_cancelled:
                    answered = True
                    await self._send({"jsonrpc": "2.0", "id": request.id, "result": result})
        except Exception as exc:
            error = handler_exception_to_error_data(exc)
            if error is None:
                _log.exception("handler for %r raised", request.method)
                error = ErrorData(code=0, message=str(exc))  # the library's dispatcher answers so too
            if not ctx.was_cancelled:
                await self._send_error(request.id, error)
            return
        if not answered and not ctx.was_cancelled:  # stopped because stdin closed: say so, not nothing
            with anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
                await self._send_error(request.id, _CLOSED)

    def _notification(
        self, message: JSONRPCNotification, on_notify: OnNotify, intercept: OnNotifyIntercept | None
    ) -> None:
        params = message.params
        if message.method == "notifications/cancelled":
            rid = cancelled_request_id_from_params(params)
            if rid is not None and (entry := self._in_flight.get(coerce_request_id(rid))) is not None:
                scope, ctx = entry
                ctx.cancel_requested.set()
                scope.cancel()
        elif message.method == "notifications/progress" and params is not None:
            self._progress(params)
        if run_notify_intercept(intercept, message.method, params):
            return
        assert self._tg is not None
        self._tg.start_soon(self._notify_handler, on_notify, _Context(self, None), message.method, params)

    @staticmethod
    async def _notify_handler(
        on_notify: OnNotify, ctx: _Context, method: str, params: Mapping[str, Any] | None
    ) -> None:
        try:
            await on_notify(ctx, method, params)
        except Exception:  # one notification's handler never takes the loop down
            _log.exception("notification handler for %r raised", method)

    def _progress(self, params: Mapping[str, Any]) -> None:
        token, progress = params.get("progressToken"), params.get("progress")
        if isinstance(token, bool) or not isinstance(token, str | int):
            return
        if isinstance(progress, bool) or not isinstance(progress, int | float):
            return
        pending = self._pending.get(coerce_request_id(token))
        if pending is None or pending.on_progress is None:
            return
        total, text = params.get("total"), params.get("message")
        assert self._tg is not None
        self._tg.start_soon(
            _report,
            pending.on_progress,
            float(progress),
            float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
            text if isinstance(text, str) else None,
        )

    def _resolve(self, request_id: RequestId | None, outcome: dict[str, Any] | ErrorData) -> None:
        pending = self._pending.get(coerce_request_id(request_id)) if request_id is not None else None
        if pending is None:
            _log.debug("dropped an answer to no request of ours: id %r", request_id)
            return
        pending.outcome = outcome
        pending.done.set()

    def _close(self) -> None:
        self._running = False
        self._closed = True
        for pending in self._pending.values():  # whoever waits on the node hears that it is gone
            pending.outcome = _CLOSED
            pending.done.set()
        self._pending.clear()

    # --- outbound ---------------------------------------------------------------------------

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._write.send_bytes(to_json(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            _log.debug("dropped a message: stdout is closed")

    async def _send_error(self, request_id: RequestId, error: ErrorData) -> None:
        await self._send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "error": error.model_dump(mode="json", by_alias=True, exclude_unset=True),
            }
        )

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if self._closed:
            _log.debug("dropped %s: the connection is closed", method)
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        await self._send(message)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        """Send a request to the node and wait for its answer (or the timeout, or the pipe's end)."""
        if self._closed:
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        if not self._running:
            raise RuntimeError("PipeDispatcher.send_raw_request called before run()")
        opts = opts or {}
        supplied = opts.get("request_id")
        if supplied is not None:
            request_id: RequestId = supplied
            key = coerce_request_id(request_id)
            if key in self._pending:
                raise ValueError(f"request id {request_id!r} is already in flight")
        else:
            request_id = self._mint()
            while request_id in self._pending:
                request_id = self._mint()
            key = request_id
        out = dict(params) if params is not None else {}
        on_progress = opts.get("on_progress")
        if on_progress is not None:  # the id doubles as the progress token, as in the library
            out["_meta"] = {**(out.get("_meta") or {}), "progressToken": request_id}
        pending = _Pending(on_progress=on_progress)
        self._pending[key] = pending
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if out:
            message["params"] = out
        timeout = opts.get("timeout")
        try:
            await self._send(message)
            with anyio.fail_after(timeout):
                await pending.done.wait()
        except TimeoutError:
            await self._abandon(request_id, f"timed out after {timeout}s", opts)
            raise MCPError(code=REQUEST_TIMEOUT, message=f"Request {method!r} timed out") from None
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(FINAL_WRITE_TIMEOUT_S, shield=True):
                await self._abandon(request_id, "caller cancelled", opts)
            raise
        finally:
            self._pending.pop(key, None)
        if isinstance(pending.outcome, ErrorData):
            raise MCPError(code=pending.outcome.code, message=pending.outcome.message, data=pending.outcome.data)
        return pending.outcome

    async def _abandon(self, request_id: RequestId, reason: str, opts: CallOptions) -> None:
        if opts.get("cancel_on_abandon", True):
            await self.notify("notifications/cancelled", {"requestId": request_id, "reason": reason})

    def _mint(self) -> int:
        self._next_id += 1
        return self._next_id


async def _report(on_progress: ProgressFnT, progress: float, total: float | None, message: str | None) -> None:
    try:
        await on_progress(progress, total, message)
    except Exception:  # a progress callback never takes the loop down
        _log.exception("progress callback raised")
