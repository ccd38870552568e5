"""One request's way, in four steps: arrive -> admit -> run on the child -> answer.

This is the hot path. It decodes the body only to check it is a JSON object and forwards the
bytes as they came; the child's result goes back as the raw bytes the child wrote. Errors are
rendered here, once, at the answer; a launcher error becomes a wire error in one place
(`wire_error`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from launcher.bundle import STARTING_STATES, BundleRunner, Pending
from launcher.errors import BundleOverloaded, BundleUnavailable, CallTimedOut, ChildError, LauncherError
from runtime.calls.desk import CallDesk, OpenCall, call_meta
from runtime.calls.identity import CallerStamp
from runtime.calls.routes import Route, RouteTable
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


class Dispatcher:
    """Answers requests; owns one task per request in flight until it is answered.

    Plain asyncio tasks, tracked here and cancelled by `cancel_all`: anyio's start_soon costs
    about three times as much per call, and the hot path pays it on every request.
    """

    def __init__(
        self, nc: Client, table: RouteTable, node: str, desk: CallDesk | None = None, stamp: CallerStamp | None = None
    ) -> None:
        self.nc = nc
        self.desk = desk  # the call protocol's options (Mesh-* headers, docs/bus.md); None: headers are not read
        # The caller each tools/call carries in _meta["mesh/caller"]; by default the OS user, local.
        self.stamp = stamp or CallerStamp(local_caller(None))
        self.table = table
        self.node = node
        self.in_flight = 0
        self.answered = 0
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
        started = time.perf_counter_ns()
        arrived = self._loop.time()
        self.in_flight += 1
        route = self.table.routes.get(msg.subject)
        call: OpenCall | None = None
        pending: Pending | None = None
        error: NodeError | None = None
        try:
            if msg.headers and self.desk is not None:
                call = self.desk.open(msg, route.bundle if route is not None else None)
            if route is not None and (call is None or call.begins_now):
                pending = self._admit(route, msg.subject, msg.data, self._meta(msg, call), arrived, call)
        except NodeError as e:
            error = e
        task = self._loop.create_task(self._serve(msg, route, pending, arrived, started, call, error))
        if call is not None:
            call.task = task  # a cancel from its caller cancels this task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- 2. admit -------------------------------------------------------------------------------
    def _admit(
        self, route: Route, subject: str, data: bytes, meta: bytes, arrived: float, call: OpenCall | None
    ) -> Pending | None:
        """Check the body and write the call now if the bundle is ready; None: it must wait."""
        checked = _checked(route, subject, data)
        deadline, timeout_ms = self.limits(arrived, route.bundle, call)
        try:
            return route.bundle.begin(route.tool_json, checked, deadline, meta, timeout_ms)
        except LauncherError as e:
            raise wire_error(route, e, self.node) from None

    async def _admit_late(
        self, msg: Msg, route: Route | None, arrived: float, call: OpenCall | None
    ) -> tuple[Route, Pending]:
        """A call that arrives while its bundle starts, or finds no free slot, waits for them (not a 503).

        So does a call whose arguments are in the object store (Mesh-Request-Object): they are read first.
        """
        if route is None:
            for bundle in self.table.starting(msg.subject):
                deadline, timeout_ms = self.limits(arrived, bundle, call)
                await bundle.settle(deadline)
                if bundle.state in STARTING_STATES:  # settle returned at the deadline: still starting
                    late = bundle.start_timed_out(msg.subject, timeout_ms)
                    raise TimedOut(msg.subject, late, _whose(late, bundle))
            route = self.table.resolve(msg.subject)
        data = msg.data
        if call is not None and call.options.request_object is not None and self.desk is not None:
            data = await self.desk.objects.take(route.subject, call.options.request_object)
        checked = _checked(route, route.subject, data)
        deadline, timeout_ms = self.limits(arrived, route.bundle, call)
        try:
            return route, await route.bundle.begin_when_ready(
                route.tool_json, checked, deadline, self._meta(msg, call), timeout_ms
            )
        except LauncherError as e:
            raise wire_error(route, e, self.node) from None

    def limits(self, arrived: float, bundle: BundleRunner, call: OpenCall | None = None) -> tuple[float, int]:
        """When the caller stops waiting (loop clock), set once from the request's arrival for the start,
        the slot and the child together, and the timeout a 504 names: the bundle's timeout, or the
        caller's shorter Mesh-Timeout-Ms."""
        cap = bundle.spec.timeout_ms
        timeout_ms = cap if call is None else call.options.timeout_for(cap)
        return arrived + timeout_ms / 1000, timeout_ms

    def _meta(self, msg: Msg, call: OpenCall | None) -> bytes:
        """The call's `_meta`: the server-stamped caller (never anything from the body), and its progress token."""
        try:
            meta = self.stamp.for_headers(msg.headers)
        except CallerError as e:
            raise BadRequest(msg.subject, str(e), field=f"header {REQUEST_INFO}") from None
        return meta if call is None else call_meta(meta, call)

    # --- 3. run on the child --------------------------------------------------------------------
    async def _run(
        self, msg: Msg, route: Route | None, pending: Pending | None, arrived: float, call: OpenCall | None
    ) -> tuple[Route, bytes]:
        """From where `start` left the call to the child's answer, as the reply's bytes."""
        if pending is None or route is None:
            route, pending = await self._admit_late(msg, route, arrived, call)
        try:
            return route, bytes(await route.bundle.finish(pending))
        except LauncherError as e:
            raise wire_error(route, e, self.node) from None

    async def _serve(
        self,
        msg: Msg,
        route: Route | None,
        pending: Pending | None,
        arrived: float,
        started: int,
        call: OpenCall | None,
        error: NodeError | None,
    ) -> None:
        """Run the call and answer it; never raises for anything a caller or a child does."""
        body = b""
        headers: dict[str, str] | None = None
        try:
            if error is not None or (call is not None and call.cancelled):
                pass  # refused at its arrival, or cancelled before it came (never begun, not answered)
            else:
                work = self._run(msg, route, pending, arrived, call)
                if call is not None and call.progress is not None:  # frames also while it waits for its bundle
                    served, body = await call.progress.during(work)
                else:
                    served, body = await work
                route = served
                if len(body) > self.max_payload and msg.reply:  # nobody to fetch it without a reply subject
                    body, headers = await self._park(msg, served, body)
        except NodeError as e:
            error = e
        except anyio.get_cancelled_exc_class():
            if call is None or not call.cancelled:
                with anyio.CancelScope(shield=True):
                    await self._answer(msg, route, b"", NodeStopping(msg.subject, self.node), started, call)
                raise
            # Cancelled by its caller: the child was told (Session.result); _answer sends nothing.
        except Exception as e:  # a bug of ours must cost one call, not the node
            log.exception("answering %s failed", msg.subject)
            error = Internal(f"{msg.subject}: internal error of the node: {type(e).__name__}: {e}")
        await self._answer(msg, route, body, error, started, call, headers)

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
        msg: Msg,
        route: Route | None,
        body: bytes,
        error: NodeError | None,
        started: int,
        call: OpenCall | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Reply (unless its caller cancelled it), then count the call in its endpoint's stats and here."""
        try:
            if call is not None and self.desk is not None:
                self.desk.close(call)  # from here a cancel finds nothing to cancel
            if call is None or not call.cancelled:
                await self._reply(msg, body, error, headers)
        finally:
            if route is not None:
                route.stats.record(time.perf_counter_ns() - started, None if error is None else f"{error.code}:{error}")
            self.answered += 1
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def _reply(
        self, msg: Msg, body: bytes | None, error: NodeError | None, headers: dict[str, str] | None = None
    ) -> None:
        if not msg.reply:
            return  # a publish without a reply subject: the call ran, nobody waits for an answer
        try:
            if error is None:
                await self.nc.publish(msg.reply, body or b"", headers=headers)
            else:
                data, headers = render(error)
                await self.nc.publish(msg.reply, data, headers=headers)
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
