"""One request's way: subject -> route -> bundle -> reply. Errors are rendered here, once.

This is the hot path. It decodes the body only to check it is a JSON object and forwards the
bytes as they came; the child's result goes back as the raw bytes the child wrote.
"""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from launcher.bundle import Pending
from launcher.errors import BundleUnavailable, CallTimedOut, ChildError

from .errors import BadRequest, Internal, NodeError, NodeStopping, NoSuchTool, TimedOut, TooLarge, Unavailable, render
from .routes import Route, RouteTable

log = logging.getLogger("mesh.dispatch")

_check_object = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_EMPTY = b"{}"


class Dispatcher:
    """Answers requests; owns one task per request in flight until it is answered.

    Plain asyncio tasks, tracked here and cancelled by `cancel_all`: anyio's start_soon costs
    about three times as much per call, and the hot path pays it on every request.
    """

    def __init__(self, nc: Client, table: RouteTable, node: str) -> None:
        self.nc = nc
        self.table = table
        self.node = node
        self.in_flight = 0
        self.answered = 0
        self._idle: asyncio.Event | None = None  # made only when someone waits for it
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()

    def start(self, msg: Msg) -> None:
        """Take one request, in the subscription's callback.

        When the route is known and its bundle ready, the call is checked and written to the
        child right here; the task only waits for the answer and replies. Everything else
        (a start to ride over, an error to render) happens in the task.
        """
        started = time.perf_counter_ns()
        self.in_flight += 1
        route = self.table.routes.get(msg.subject)
        begun: Pending | BaseException | None = None
        if route is not None:
            try:
                data = self._checked(route, msg.data)
                begun = route.bundle.begin(route.tool_json, data)
            except (NodeError, BundleUnavailable) as e:
                begun = e
        task = self._loop.create_task(self.serve(msg, route, begun, started))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel_all(self) -> None:
        """Answer what is still in flight 503 "node stopping" and wait until it is sent."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def max_payload(self) -> int:
        return self.nc.max_payload or 1024 * 1024

    async def serve(self, msg: Msg, route: Route | None, begun: "Pending | BaseException | None", started: int) -> None:
        """Answer one request; never raises for anything a caller or a child does."""
        error: NodeError | None = None
        body = b""
        try:
            if isinstance(begun, BaseException):
                raise begun
            if begun is not None:
                assert route is not None
                result = await route.bundle.finish(begun)
            else:
                if route is None:
                    route = await self._route_after_start(msg.subject)
                result = await route.bundle.call(route.tool_json, self._checked(route, msg.data))
            if len(result) > self.max_payload:
                raise TooLarge(route.subject, f"the result of {route.tool}", len(result), self.max_payload)
            body = bytes(result)
        except NodeError as e:
            error = e
        except BundleUnavailable as e:
            error = Unavailable(route.tool if route else msg.subject, route.module if route else "?", e, self.node)
        except CallTimedOut as e:
            error = TimedOut(route.tool if route else msg.subject, e)
        except ChildError as e:
            error = _child_error(msg.subject, e)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._reply(msg, None, NodeStopping(msg.subject, self.node))
            raise
        except Exception as e:  # a bug of ours must cost one call, not the node
            log.exception("answering %s failed", msg.subject)
            error = Internal(f"{msg.subject}: internal error of the node: {type(e).__name__}: {e}")
        try:
            await self._reply(msg, body, error)
        finally:
            if route is not None:
                route.num_requests += 1
                route.processing_ns += time.perf_counter_ns() - started
                if error is not None:
                    route.num_errors += 1
                    route.last_error = f"{error.code}:{error}"[:512]
            self.answered += 1
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()

    async def _route_after_start(self, subject: str) -> Route:
        # A call that arrives while its bundle starts waits for the start, not a 503.
        for bundle in self.table.starting(subject):
            await bundle.settle(bundle.spec.timeout_ms / 1000)
        return self.table.resolve(subject)

    def _checked(self, route: Route, data: bytes) -> bytes:
        """The body as it goes to the child, or BadRequest naming what is wrong."""
        subject = route.subject
        if not data:
            if route.checker is not None and (problem := route.checker.problem({})) is not None:
                raise BadRequest(subject, problem[1], field=problem[0])
            return _EMPTY
        try:
            data.decode("utf-8")  # msgspec.Raw does not look inside strings; a child must get UTF-8
            args = _check_object(data)
        except UnicodeDecodeError as e:
            raise BadRequest(subject, f"the body is not valid JSON (not UTF-8 at byte {e.start}); send the arguments as a UTF-8 JSON object")
        except RecursionError:
            raise BadRequest(subject, "the body nests too deeply; send a flatter JSON object")
        except msgspec.ValidationError:
            raise BadRequest(subject, "the body must be a JSON object of the tool's arguments, e.g. {\"name\": \"Ada\"}")
        except msgspec.DecodeError as e:
            raise BadRequest(subject, f"the body is not valid JSON ({e}); send the arguments as a JSON object")
        if route.checker is not None and (problem := route.checker.problem(args)) is not None:
            raise BadRequest(subject, problem[1], field=problem[0])
        return data

    async def _reply(self, msg: Msg, body: bytes | None, error: NodeError | None) -> None:
        if not msg.reply:
            return  # a publish without a reply subject: the call ran, nobody waits for an answer
        try:
            if error is None:
                await self.nc.publish(msg.reply, body or b"")
            else:
                data, headers = render(error)
                await self.nc.publish(msg.reply, data, headers=headers)
        except Exception as e:  # the bus is gone or the reply is refused: say so, nothing else to do
            log.warning("could not answer %s: %s", msg.subject, e)

    async def wait_idle(self) -> None:
        while self.in_flight:
            self._idle = asyncio.Event()
            await self._idle.wait()


def _child_error(subject: str, e: ChildError) -> NodeError:
    if e.code == -32602:
        return BadRequest(subject, f"the tool refused its arguments: {e.message}")
    if e.code == -32601:
        return NoSuchTool(subject, f"the bundle does not know this tool: {e.message}", [])
    return Internal(f"{subject}: the bundle answered JSON-RPC error {e.code}: {e.message}")
