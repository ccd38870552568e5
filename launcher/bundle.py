"""One tools bundle's lifecycle: start, handshake, serve calls, health, restart, give up.

States: starting -> ready -> (child exits) -> starting again at once, then backoff with jitter;
too many restarts in the window -> failed, until an operator resets it; an operator's restart of a
ready bundle shows `restarting` (calls ride over it); stopped at the end. The loop itself is
launcher/supervise.py, shared with the services the node runs; this module keeps what is MCP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import anyio
import msgspec

from .errors import (
    WAITED_FOR_SLOT,
    WAITED_FOR_START,
    BundleOverloaded,
    BundleUnavailable,
    CallTimedOut,
    ChildError,
    ProtocolError,
    SessionClosed,
)
from .logbudget import LogBudget
from .process import ChildProcess, ChildSpec
from .reaper import Reaper
from .restart import RestartPolicy
from .session import Call, Session, Tool
from .slots import Slots
from .status import BundleStatus, bundle_status
from .supervise import STDERR_TAIL, Supervised, describe_exit

log = logging.getLogger("mesh.bundle")

# Shared with the service supervisor; kept importable from here for the launcher's users.
__all__ = ["STDERR_TAIL", "BundleRunner", "HealthPolicy", "LogBudget", "RestartPolicy", "RunnerSpec", "describe_exit"]

# States in which a call waits (inside its deadline) instead of being answered 503 at once.
STARTING_STATES = ("starting", "restarting")


class HealthPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a child is watched and stopped; also the `[health]` table of the node's config."""

    init_timeout_s: float = 10.0
    ping_interval_s: float = 5.0
    ping_timeout_s: float = 5.0
    ping_misses: int = 2  # consecutive unanswered pings before the child is killed
    # Bytes written to a child's stdin and not read by it yet; past this the child is hung (killed).
    max_stdin_bytes: int = 32 * 1024 * 1024
    stop_grace_s: float = 2.0


@dataclass(frozen=True)
class RunnerSpec:
    module: str
    name: str
    language: str
    child: ChildSpec
    timeout_ms: int  # the manifest's; its default is written there
    max_in_flight: int
    restart: RestartPolicy = RestartPolicy()
    health: HealthPolicy = HealthPolicy()
    # Builds the bundle before its first start (compiled code served from source); gives the
    # child to run. A failure is not retried on its own: the bundle is failed until reset.
    prepare: Callable[[], Awaitable[ChildSpec]] | None = None
    # Calls waiting for a slot while all max_in_flight are taken, bounded in count and in bytes of
    # arguments: one more is answered 503 `overloaded` at once (an unbounded wait ate the node).
    max_waiting: int = 256
    max_waiting_bytes: int = 16 * 1024 * 1024

    @property
    def key(self) -> str:
        return f"{self.module}/{self.name}"


class Pending:
    """A call written to a child, not yet answered."""

    __slots__ = ("session", "call")

    def __init__(self, session: Session, call: Call) -> None:
        self.session, self.call = session, call


class RunnerEvents:
    """What a runner tells its owner (the node's module host): its state, its tools, a child's progress.

    Called synchronously from the runner's own task; an owner overrides what it listens to. The
    default listens to nothing (a runner on its own, as in the launcher's tests)."""

    def state_changed(self, runner: BundleRunner) -> None:
        """Every change of `runner.state`."""

    def tools_changed(self, runner: BundleRunner) -> None:
        """`runner.tools` is a new list (a start, or the child's list_changed)."""

    def progress(self, runner: BundleRunner, params: msgspec.Raw) -> None:
        """A child's `notifications/progress`, for the caller that asked for it."""

    def ask(self, runner: BundleRunner, session: Session, rid: int | str, method: str, params: msgspec.Raw) -> bool:
        """A child's own request (elicitation, sampling, roots) during a call: True when taken (the owner
        answers it with `session.respond`); False: refused as a method the node does not offer."""
        return False


class BundleRunner(Supervised):
    """A supervised tools child. `run()` is owned by the node's task group; `call()` by a request."""

    def __init__(
        self,
        spec: RunnerSpec,
        events: RunnerEvents | None = None,
        reaper: Reaper | None = None,
    ) -> None:
        self.events = events or RunnerEvents()
        super().__init__(spec.module, spec.name, spec.restart, spec.child, spec.prepare, reaper)
        self.spec = spec
        self.tools: dict[str, Tool] = {}
        self.calls = 0
        self._session: Session | None = None
        self._slots = Slots(spec.max_in_flight, spec.max_waiting, spec.max_waiting_bytes)
        self._relist = asyncio.Event()
        self._call_timed_out_at = float("-inf")  # loop clock: the last call the child did not answer in time
        self._stdin_limit = spec.health.max_stdin_bytes

    def _state_changed(self) -> None:
        self.events.state_changed(self)

    # --- calls ----------------------------------------------------------------------------
    def begin(
        self, tool_json: bytes, arguments: bytes, deadline: float, meta: bytes = b"", timeout_ms: int = 0
    ) -> Pending | None:
        """The fast path: when ready with a free slot, write the call now; None: use begin_when_ready().

        `deadline` is on the event loop's clock: the moment the caller stops waiting. `meta` is the
        call's `params._meta` (empty: none); `timeout_ms` the timeout a 504 names (0: the bundle's).
        """
        session = self._session
        if self.state != "ready" or session is None or not self._slots.try_acquire():
            return None
        return self._write_call(session, tool_json, arguments, deadline, meta, timeout_ms)

    def overloaded(self, size: int) -> BundleOverloaded | None:
        """Whether a call of `size` bytes of arguments would be refused at once: ready, every slot
        taken and no room to wait. Asked before its arguments are read: a flood costs little."""
        slots = self._slots
        if self.state != "ready" or (slots.used < slots.size and not slots.waiting) or slots.room_to_wait(size):
            return None
        return BundleOverloaded(self.key, slots.used, slots.size, slots.waiting, slots.max_waiting_bytes)

    async def begin_when_ready(
        self, tool_json: bytes, arguments: bytes, deadline: float, meta: bytes = b"", timeout_ms: int = 0
    ) -> Pending:
        """Write a call once the bundle is ready and a slot is free, riding over a start; by `deadline`.

        BundleUnavailable at once when the bundle is down, BundleOverloaded at once when too many calls
        wait for a slot already, CallTimedOut (saying what it waited for) when the deadline passes first.
        """
        loop = asyncio.get_running_loop()
        session = self._session
        if self.state != "ready" or session is None:
            session = await self._wait_ready(deadline, tool_json, timeout_ms)
        slots = self._slots
        if not slots.try_acquire():
            if not slots.room_to_wait(len(arguments)):
                raise BundleOverloaded(self.key, slots.used, slots.size, slots.waiting, slots.max_waiting_bytes)
            late = CallTimedOut(self.key, tool_json.decode(), timeout_ms or self.spec.timeout_ms, WAITED_FOR_SLOT)
            if not await slots.acquire(deadline - loop.time(), len(arguments)):
                raise late
            if loop.time() >= deadline:  # the slot came too late to write the call
                slots.release()
                raise late
            if self._session is not session:  # the child changed while this call waited
                if self.state != "ready" or self._session is None:
                    slots.release()
                    raise self.unavailable()
                session = self._session
        return self._write_call(session, tool_json, arguments, deadline, meta, timeout_ms)

    def _write_call(
        self, session: Session, tool_json: bytes, arguments: bytes, deadline: float, meta: bytes, timeout_ms: int
    ) -> Pending:
        # The slot is held; whatever goes wrong here frees it again.
        self.calls += 1
        try:
            call = session.begin_tool_call(tool_json, arguments, deadline, timeout_ms or self.spec.timeout_ms, meta)
            return Pending(session, call)
        except SessionClosed as e:
            self._slots.release()
            raise self.unavailable(e.reason) from e
        except BaseException:
            self._slots.release()
            raise

    async def finish(self, pending: Pending) -> msgspec.Raw:
        """The answer to a call begun with begin(); frees its slot whatever happens."""
        try:
            return await pending.session.result(pending.call)
        except SessionClosed as e:
            raise self.unavailable(e.reason) from e
        except CallTimedOut:
            self._call_timed_out_at = asyncio.get_running_loop().time()  # health: the grace is over
            raise
        finally:
            self._slots.release()

    async def settle(self, deadline: float) -> bool:
        """Wait while a start is in progress (until `deadline`, loop clock): a start is ridden over.

        One start, not the restarts after it: the one in progress, or the next one when the child
        is being restarted (`restarting`) or the last start has just failed. True when that start is
        over (ready, or the bundle is down), False when the deadline came first; BundleUnavailable
        (`start_failed`) at once when that start failed, whatever comes after it.
        """
        loop = asyncio.get_running_loop()
        waits_for = self.starts
        if self.state == "restarting" or self.failed_start == self.starts:
            waits_for += 1  # the start that comes next
        while self.state in STARTING_STATES and self.failed_start < waits_for:
            changed = self._changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return False
        if self.failed_start >= waits_for:
            raise self.start_failed()
        return True

    async def _wait_ready(self, deadline: float, tool_json: bytes, timeout_ms: int = 0) -> Session:
        # Any state but a start is down: answered at once. A start past the deadline is a 504; a
        # start that failed is settle's 503.
        if not await self.settle(deadline):
            raise self.start_timed_out(tool_json.decode(), timeout_ms)
        if self.state == "ready" and self._session is not None:
            return self._session
        raise self.unavailable()

    def start_failed(self) -> BundleUnavailable:
        """The 503 of a call that waited for a start that did not come up."""
        why = self.start_failure or "it did not come up"
        return self.unavailable(f"its start failed: {why}; the node starts it again on its own")

    def start_timed_out(self, what: str, timeout_ms: int = 0) -> CallTimedOut:
        return CallTimedOut(self.key, what, timeout_ms or self.spec.timeout_ms, WAITED_FOR_START)

    def unavailable(self, reason: str = "") -> BundleUnavailable:
        state = self.state if self.state != "ready" else "restarting"
        return BundleUnavailable(
            self.key, state, self.last_exit, list(self.stderr_tail), reason or (self.last_error or "")
        )

    # --- operator -------------------------------------------------------------------------
    def request_restart(self) -> None:
        """Operator's reset: a failed bundle starts again; a running one is restarted."""
        super().request_restart()
        if self._child is not None and self._child.running:
            self._child.close_stdin()  # the MCP way to say "exit"

    async def drain(self, timeout: float) -> None:
        """Wait (at most `timeout`) until no call is in flight on this bundle."""
        with anyio.move_on_after(timeout):
            while self._slots.used > 0:
                await anyio.sleep(0.01)

    @property
    def waiting(self) -> int:
        """Calls waiting for a free slot."""
        return self._slots.waiting

    def status(self) -> BundleStatus:
        session = self._session
        return bundle_status(
            self,
            self.spec.module,
            self.spec.name,
            self.spec.language,
            list(self.stderr_tail),
            tools=sorted(self.tools),
            protocol_version=session.protocol_version if session else None,
            era=session.era if session else None,
            in_flight=session.in_flight if session else 0,
            calls=self.calls,
            state_for_s=round(time.monotonic() - self.state_since, 1),
            confinement=self.confinement,
        )

    # --- one life of the child --------------------------------------------------------
    async def _run_once(self) -> float | None:
        """Start one child and serve until it exits. Returns when it became ready, if it did."""
        spec = self.spec
        session = Session(self.key, self._notification, self._child_request)
        child = await self._spawn(session.feed)
        if child is None:
            return None
        session.attach(child.write)
        ready_at: float | None = None
        try:
            async with anyio.create_task_group() as tg:
                self._watch(tg, child)  # from the first line on: a stop or restart does not wait out the handshake
                try:
                    await session.open(spec.health.init_timeout_s)
                    tools = await session.list_tools(spec.health.init_timeout_s)
                except (CallTimedOut, ProtocolError, ChildError, SessionClosed) as e:
                    self.last_error = f"did not complete the MCP handshake: {_reason(e)}"
                    log.error("bundle %s %s", self.key, self.last_error)
                    self._start_failed()  # the calls waiting for this start learn now, not after the next one
                    tg.cancel_scope.cancel()
                    return None
                self._session = session
                self._set_tools(tools)
                self._set_state("ready")
                ready_at = asyncio.get_running_loop().time()
                log.info(
                    "bundle %s ready: pid %d, MCP %s (%s), %d tools; confinement: %s",
                    self.key,
                    child.pid,
                    session.protocol_version,
                    session.era,
                    len(tools),
                    child.confinement,
                )
                tg.start_soon(self._health, child, session)
                tg.start_soon(self._relist_tools, session)
                await anyio.sleep_forever()  # until the child exits or a stop/restart is asked
        finally:
            with anyio.CancelScope(shield=True):
                await self._end_child(child, session)
                if ready_at is None and not self._stopping:
                    await self._last_words(child)
        return ready_at

    async def _end_child(self, child: ChildProcess, session: Session) -> None:
        if child.running:
            status = await child.stop(self.spec.health.stop_grace_s)
        else:
            status = await child.wait()
        self._session = None
        self.last_exit = describe_exit(status)
        # Calls in flight learn now, not at their timeout.
        session.close(self.unavailable(f"the child ended ({self.last_exit})"))
        self._forget_child(child, status)

    async def _health(self, child: ChildProcess, session: Session) -> None:
        h = self.spec.health
        loop = asyncio.get_running_loop()
        misses = 0
        while child.running:
            await anyio.sleep(h.ping_interval_s)
            if loop.time() - max(session.last_seen, child.last_output) < h.ping_interval_s and misses == 0:
                continue  # it spoke recently: alive
            sent = loop.time()
            try:
                await session.ping(h.ping_timeout_s)
                misses = 0
            except CallTimedOut:
                if child.last_output > sent:
                    continue  # busy writing a long answer; the ping's answer waits behind it
                if self._busy_in_time(session):
                    misses = 0
                    continue
                misses += 1
                if misses >= h.ping_misses:
                    self.last_error = f"stopped answering ping ({misses} x {h.ping_timeout_s:g} s)"
                    log.error("bundle %s %s: killing it", self.key, self.last_error)
                    child.kill()
                    return
            except (SessionClosed, ChildError, BundleUnavailable):
                return

    def _busy_in_time(self, session: Session) -> bool:
        """Calls are in flight and none has passed its timeout since the child last spoke.

        A child that handles one request at a time answers no ping during a long call: missed
        pings then do not count, and the calls' own timeouts watch it. Once a call times out with
        no sign of life since, the grace ends and missed pings count again.
        """
        return self._slots.used > 0 and self._call_timed_out_at <= session.last_seen

    def _child_request(self, session: Session, rid: int | str, method: str, params: msgspec.Raw) -> bool:
        return self.events.ask(self, session, rid, method, params)

    def _notification(self, method: str, params: msgspec.Raw) -> None:
        if method == "notifications/tools/list_changed":
            self._relist.set()
        elif method == "notifications/progress":
            self.events.progress(self, params)

    async def _relist_tools(self, session: Session) -> None:
        while True:
            await self._relist.wait()
            self._relist.clear()
            try:
                tools = await session.list_tools(self.spec.health.init_timeout_s)
            except (CallTimedOut, ProtocolError, ChildError, SessionClosed, BundleUnavailable) as e:
                log.warning("bundle %s: listing tools again failed: %s", self.key, _reason(e))
                continue
            self._set_tools(tools)
            log.info("bundle %s: tools changed, now %d", self.key, len(tools))

    def _set_tools(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}
        self.events.tools_changed(self)


def _reason(e: Exception) -> str:
    if isinstance(e, CallTimedOut):
        return f"no answer to {e.what} within {e.timeout_ms} ms ([health] init_timeout_s)"
    if isinstance(e, (ProtocolError, SessionClosed)):
        return e.reason
    if isinstance(e, BundleUnavailable):
        return f"the child ended ({e.last_exit})"
    return str(e)
