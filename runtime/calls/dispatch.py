"""One request's way, in four steps: arrive -> admit -> run on the child -> answer.

This is the hot path. It decodes the body only to check it is a JSON object and forwards the
bytes as they came; the child's result goes back as the raw bytes the child wrote. Errors are
rendered here, once, at the answer; a launcher error becomes a wire error in one place
(`wire_error`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from launcher.bundle import BundleRunner, Pending
from launcher.errors import BundleOverloaded, BundleUnavailable, CallTimedOut, ChildError, LauncherError
from runtime.bus.service_api import EndpointStats
from runtime.calls.desk import CallDesk, OpenCall, call_meta
from runtime.calls.identity import CallerStamp
from runtime.calls.routes import Route, RouteTable
from runtime.calls.tracing import CURRENT, CallSpan, Tracing
from runtime.wire.callproto import request_account
from runtime.wire.errors import (
    BadRequest,
    Internal,
    NodeError,
    NodeStopping,
    NoSuchTool,
    Overloaded,
    TimedOut,
    TooLarge,
    Unavailable,
    render,
)
from runtime.wire.identity import REQUEST_INFO, CallerError, local_caller

log = logging.getLogger("mesh.dispatch")

_check_object = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_EMPTY = b"{}"
TOOL_ERROR = "tool_error"  # a CallToolResult with isError: the tool answered, and said it failed


class _Outcome(msgspec.Struct):
    isError: bool = False


_outcome = msgspec.json.Decoder(_Outcome).decode


def _is_tool_error(body: bytes) -> bool:
    """Whether a child's result says `isError: true`; read only when the key is there at all."""
    if b'"isError"' not in body:
        return False
    try:
        return _outcome(body).isError
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


class Arrival:
    """One request as it arrived: the message, when (loop clock, and the clock its stats use), its
    options (the call protocol's, as one value; None for a plain request) and its span (None when
    tracing is off)."""

    __slots__ = ("msg", "arrived", "started", "call", "span")

    def __init__(self, msg: Msg, arrived: float, started: int) -> None:
        self.msg, self.arrived, self.started = msg, arrived, started
        self.call: OpenCall | None = None
        self.span: CallSpan | None = None


class Dispatcher:
    """Answers requests; owns one task per request in flight until it is answered.

    Plain asyncio tasks, tracked here and cancelled by `cancel_all`: anyio's start_soon costs
    about three times as much per call, and the hot path pays it on every request.
    """

    def __init__(
        self,
        nc: Client,
        table: RouteTable,
        node: str,
        desk: CallDesk | None = None,
        stamp: CallerStamp | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.tracing = tracing  # OpenTelemetry, when the environment asks for it (calls/tracing.py)
        self.nc = nc
        self.desk = desk  # the call protocol's options (Mesh-* headers, docs/bus.md); None: headers are not read
        # The caller each tools/call carries in _meta["mesh/caller"]; by default the OS user, local.
        self.stamp = stamp or CallerStamp(local_caller(None))
        self.table = table
        self.node = node
        self.in_flight = 0
        self.answered = 0
        self.unrouted = EndpointStats()  # calls to a subject no route serves: one series, whatever the subject
        self._idle: asyncio.Event | None = None  # made only when someone waits for it
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()

    # --- 1. arrive ------------------------------------------------------------------------------
    def start(self, msg: Msg) -> None:
        """Take one request, in the subscription's callback.

        Its options (Mesh-* headers) are read and registered here, before its task runs, so a
        cancel finds it. When the route is known and its bundle ready, the call is admitted and
        written to the child right here; the task waits for the answer and replies.
        """
        self.in_flight += 1
        route = self.table.routes.get(msg.subject)
        a = Arrival(msg, self._loop.time(), time.perf_counter_ns())
        pending: Pending | None = None
        error: NodeError | None = None
        if self.tracing is not None:
            a.span = self._span(msg, route)
        try:
            if msg.headers and self.desk is not None:
                a.call = self.desk.open(msg, route.bundle if route is not None else None)
            if route is not None and (a.call is None or a.call.begins_now):
                pending = self._admit(route, a)
        except NodeError as e:
            error = e
        serve = self._serve(a, route, pending, error)
        if a.span is None:
            task = self._loop.create_task(serve)
        else:  # its log lines name its trace (runtime/node/logs.py)
            context = contextvars.copy_context()
            context.run(CURRENT.set, a.span.ids)
            task = self._loop.create_task(serve, context=context)
        if a.call is not None:
            a.call.task = task  # a cancel from its caller cancels this task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _span(self, msg: Msg, route: Route | None) -> CallSpan:
        assert self.tracing is not None
        if route is not None:
            return self.tracing.start(msg.headers, msg.subject, route.tool, route.module, route.bundle.key)
        return self.tracing.start(msg.headers, msg.subject, msg.subject.rpartition(".")[2], "", "")

    # --- 2. admit -------------------------------------------------------------------------------
    def _admit(self, route: Route, a: Arrival) -> Pending | None:
        """Check the body and write the call now if the bundle is ready; None: it must wait."""
        data = a.msg.data
        refused = self.table.fence(a.msg.subject, route.module) if self.table.fence is not None else None
        if refused is not None:  # a stateful seat's lease lapsed here (runtime/seats/seats.py)
            raise refused
        full = route.bundle.overloaded(len(data) or len(_EMPTY))
        if full is not None:  # refused before its body is read: under a flood, each costs little
            raise wire_error(route, full, self.node)
        checked = _checked(route, a.msg.subject, data)
        deadline, timeout_ms = self.limits(a.arrived, route.bundle, a.call)
        if a.call is not None and self.desk is not None:
            self.desk.begun(a.call, route.bundle)  # a child's request naming no call may be this one's
        try:
            return route.bundle.begin(route.tool_json, checked, deadline, self._meta(a), timeout_ms)
        except LauncherError as e:
            raise wire_error(route, e, self.node) from None

    async def _admit_late(self, a: Arrival, route: Route | None) -> tuple[Route, Pending]:
        """A call that arrives while its bundle starts, or finds no free slot, waits for them (not a 503).

        So does a call whose arguments are in the object store (Mesh-Request-Object): they are read first.
        """
        msg, call = a.msg, a.call
        if route is None:
            for bundle in self.table.starting(msg.subject):
                if a.span is not None:
                    a.span.waiting("start")
                deadline, timeout_ms = self.limits(a.arrived, bundle, call)
                try:
                    settled = await bundle.settle(deadline)
                except BundleUnavailable as e:  # the start it waited for failed
                    raise self.table.why_not(msg.subject, down=e) from None
                if not settled:  # the deadline came first: still starting
                    late = bundle.start_timed_out(msg.subject, timeout_ms)
                    raise TimedOut(msg.subject, late, _whose(late, bundle))
            route = self.table.resolve(msg.subject)
        data = msg.data
        if call is not None and call.options.request_object is not None and self.desk is not None:
            data = await self.desk.objects.take(route.subject, call.options.request_object)
        checked = _checked(route, route.subject, data)
        deadline, timeout_ms = self.limits(a.arrived, route.bundle, call)
        if call is not None and self.desk is not None:
            self.desk.begun(call, route.bundle)
        if a.span is not None:
            a.span.waiting("slot")
        try:
            pending = await route.bundle.begin_when_ready(route.tool_json, checked, deadline, self._meta(a), timeout_ms)
        except LauncherError as e:
            raise wire_error(route, e, self.node) from None
        if a.span is not None:
            a.span.reached_child()
        return route, pending

    def limits(self, arrived: float, bundle: BundleRunner, call: OpenCall | None = None) -> tuple[float, int]:
        """When the caller stops waiting (loop clock), set once from the request's arrival for the start,
        the slot and the child together, and the timeout a 504 names: the bundle's timeout, or the
        caller's shorter Mesh-Timeout-Ms."""
        cap = bundle.spec.timeout_ms
        timeout_ms = cap if call is None else call.options.timeout_for(cap)
        if call is not None and call.asks is not None:
            call.asks.deadline = arrived + timeout_ms / 1000  # an ask's answer may come until then
        return arrived + timeout_ms / 1000, timeout_ms

    def _meta(self, a: Arrival) -> bytes:
        """The call's `_meta`: the server-stamped caller (never anything from the body), its progress
        token, and its trace context (the child's spans join the call's trace)."""
        try:
            meta = self.stamp.for_headers(a.msg.headers, None if a.call is None else a.call.options.person)
        except CallerError as e:
            raise BadRequest(a.msg.subject, str(e), field=f"header {e.header}") from None
        if a.call is not None:
            meta = call_meta(meta, a.call)
        if a.span is not None:
            meta = _with(meta, a.span.meta())
        return meta

    # --- 3. run on the child --------------------------------------------------------------------
    async def _run(self, a: Arrival, route: Route | None, pending: Pending | None) -> tuple[Route, bytes]:
        """From where `start` left the call to the child's answer, as the reply's bytes."""
        if pending is None or route is None:
            route, pending = await self._admit_late(a, route)
        try:
            return route, bytes(await route.bundle.finish(pending))
        except LauncherError as e:
            raise wire_error(route, e, self.node) from None

    async def _serve(self, a: Arrival, route: Route | None, pending: Pending | None, error: NodeError | None) -> None:
        """Run the call and answer it; never raises for anything a caller or a child does."""
        call = a.call
        body = b""
        headers: dict[str, str] | None = None
        call_task: str | None = None
        try:
            if error is not None or (call is not None and call.cancelled):
                pass  # refused at its arrival, or cancelled before it came (never begun, not answered)
            else:
                if call is not None and call.options.detached and self.desk is not None:
                    assert call.options.call_id is not None  # parse_headers requires it
                    call.task_key = await self.desk.tasks.open(
                        call.options.call_id, a.msg.subject, a.msg, call.options.person
                    )
                    if call.asks is not None:
                        call.asks.task_key = call.task_key
                work = self._run(a, route, pending)
                if call is not None and call.progress is not None:  # frames also while it waits for its bundle
                    served, body = await call.progress.during(work)
                else:
                    served, body = await work
                route = served
                call_task = call.task_key if call is not None else None
                if len(body) > self.max_payload and a.msg.reply and call_task is None:  # a task parks its own
                    body, headers = await self._park(a.msg, served, body)
        except NodeError as e:
            error = e
        except anyio.get_cancelled_exc_class():
            if call is None or not call.cancelled:
                with anyio.CancelScope(shield=True):
                    await self._answer(a, route, b"", NodeStopping(a.msg.subject, self.node))
                raise
            # Cancelled by its caller: the child was told (Session.result); _answer sends nothing.
        except Exception as e:  # a bug of ours must cost one call, not the node
            log.exception("answering %s failed", a.msg.subject)
            error = Internal(f"{a.msg.subject}: internal error of the node: {type(e).__name__}: {e}")
        await self._answer(a, route, body, error, headers)

    async def _park(self, msg: Msg, route: Route, body: bytes) -> tuple[bytes, dict[str, str]]:
        """A result larger than one message: into the object store for its caller's account, the reply
        a reference to it."""
        what = f"the result of {route.tool}"
        if self.desk is None:
            raise TooLarge(route.subject, what, len(body), self.max_payload)
        try:
            account = request_account(msg.headers)
        except ValueError as e:
            raise BadRequest(msg.subject, str(e), field=f"header {REQUEST_INFO}") from None
        return await self.desk.objects.park(route.subject, what, body, account)

    # --- 4. answer ------------------------------------------------------------------------------
    async def _answer(
        self,
        a: Arrival,
        route: Route | None,
        body: bytes,
        error: NodeError | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Reply (unless its caller cancelled it), then count the call in its endpoint's stats and here."""
        call = a.call
        try:
            if call is not None and self.desk is not None:
                self.desk.close(call)  # from here a cancel finds nothing to cancel
            if call is not None and call.task_key is not None and self.desk is not None:
                # A detached call: its caller had its task; the end goes into the task's record.
                await self.desk.tasks.settle(call.task_key, body, error, call.cancelled)
            elif call is None or not call.cancelled:
                await self._reply(a.msg, body, error, headers)
        finally:
            elapsed = time.perf_counter_ns() - a.started
            stats = route.stats if route is not None else self.unrouted
            if error is None:
                code = TOOL_ERROR if _is_tool_error(body) else "ok"
                stats.record(elapsed, None, code)
            else:
                code = str(error.code)
                stats.record(elapsed, f"{error.code}:{error}", code)
            if a.span is not None:
                a.span.end(
                    code if call is None or not call.cancelled else "cancelled", "" if error is None else str(error)
                )
            self.answered += 1
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def _reply(
        self, msg: Msg, body: bytes | None, error: NodeError | None, headers: dict[str, str] | None = None
    ) -> None:
        if not msg.reply:
            return  # a publish without a reply subject: the call ran, nobody waits for an answer
        # On the connection the request came on (its module's lane, runtime/bus/service_api.py): one
        # socket per call, not two (bench.compare: p50 0.91x, node CPU 0.95x against the node's own).
        # A lane closed under the call (its module removed, the node stopping) leaves the node's own.
        nc = msg._client if msg._client is not None and msg._client.is_connected else self.nc
        try:
            if error is None:
                await nc.publish(msg.reply, body or b"", headers=headers)
            else:
                data, headers = render(error)
                await nc.publish(msg.reply, data, headers=headers)
        except Exception as e:  # the bus is gone or the reply is refused: say so, nothing else to do
            log.warning("could not answer %s: %s", msg.subject, e)

    # --- the dispatcher's own life --------------------------------------------------------------
    @property
    def max_payload(self) -> int:
        return self.nc.max_payload or 1024 * 1024

    async def cancel_all(self) -> None:
        """Answer what is still in flight 503 "node stopping" and wait until it is sent."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_idle(self) -> None:
        while self.in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()


def wire_error(route: Route, e: LauncherError, node: str) -> NodeError:
    """A launcher error met by a call on `route`, as the runtime error its caller gets (the one translation)."""
    if isinstance(e, BundleUnavailable):
        return Unavailable(route.tool, route.module, e, node)
    if isinstance(e, BundleOverloaded):
        return Overloaded(route.tool, route.module, e, node)
    if isinstance(e, CallTimedOut):
        return TimedOut(route.tool, e, _whose(e, route.bundle))
    if isinstance(e, ChildError):
        if e.code == -32602:
            return BadRequest(route.subject, f"the tool refused its arguments: {e.message}")
        if e.code == -32601:
            return NoSuchTool(route.subject, f"the bundle does not know this tool: {e.message}", [])
        return Internal(f"{route.subject}: the bundle answered JSON-RPC error {e.code}: {e.message}")
    return Internal(f"{route.subject}: {type(e).__name__}: {e}")


def _with(meta: bytes, fields: bytes) -> bytes:
    """`meta` (a JSON object, or empty) with `fields` (`"k":v,...`) added."""
    if not fields:
        return meta
    if not meta or meta == b"{}":
        return b"{" + fields + b"}"
    return meta[:-1] + b"," + fields + b"}"


def _whose(late: CallTimedOut, bundle: BundleRunner) -> str:
    """Whose deadline a timed-out call ran into: the caller's (a shorter Mesh-Timeout-Ms) or the bundle's."""
    return "caller" if late.timeout_ms < bundle.spec.timeout_ms else "bundle"


def _checked(route: Route, subject: str, data: bytes) -> bytes:
    """The body as it goes to the child, or BadRequest naming what is wrong."""
    if not data:
        if route.checker is not None and (problem := route.checker.problem({})) is not None:
            raise BadRequest(subject, problem[1], field=problem[0])
        return _EMPTY
    try:
        data.decode("utf-8")  # msgspec.Raw does not look inside strings; a child must get UTF-8
        args = _check_object(data)
    except UnicodeDecodeError as e:
        raise BadRequest(
            subject,
            f"the body is not valid JSON (not UTF-8 at byte {e.start}); send the arguments as a UTF-8 JSON object",
        ) from None
    except RecursionError:
        raise BadRequest(subject, "the body nests too deeply; send a flatter JSON object") from None
    except msgspec.ValidationError:
        raise BadRequest(
            subject, 'the body must be a JSON object of the tool\'s arguments, e.g. {"name": "Ada"}'
        ) from None
    except msgspec.DecodeError as e:
        raise BadRequest(subject, f"the body is not valid JSON ({e}); send the arguments as a JSON object") from None
    if route.checker is not None and (problem := route.checker.problem(args)) is not None:
        raise BadRequest(subject, problem[1], field=problem[0])
    return data
