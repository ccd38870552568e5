"""One tools bundle's lifecycle: start, handshake, serve calls, health, restart, give up.

States: starting -> ready -> (child exits) -> starting again at once, then backoff with jitter;
too many restarts in the window -> failed, until an operator resets it; stopped at the end.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import random
import signal
from dataclasses import dataclass
from typing import Awaitable, Callable

import anyio
import msgspec

from .cgroup import kill as kill_cgroup
from .cgroup import remove as remove_cgroup
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
from .reaper import Reaper, kill_marked
from .session import Call, Session, Tool

log = logging.getLogger("mesh.bundle")
_RUNNER_SERIAL = itertools.count(1)

STDERR_TAIL = 50
# States in which a call waits (inside its deadline) instead of being answered 503 at once.
STARTING_STATES = ("starting", "restarting")


class RestartPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When a child that ended is started again; also the `[restart]` table of the node's config."""

    max_restarts: int = 5  # within window_s; one more and the bundle is failed
    window_s: float = 60.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 30.0
    stable_after_s: float = 10.0  # a child that served this long starts again at once


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


class BundleStatus(msgspec.Struct):
    module: str
    bundle: str
    language: str
    state: str
    pid: int | None
    restarts: int
    tools: list[str]
    last_exit: str | None
    last_error: str | None
    protocol_version: str | None
    in_flight: int
    calls: int
    stderr_tail: list[str]


def describe_exit(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit code {status}"


class Pending:
    """A call written to a child, not yet answered."""

    __slots__ = ("session", "call")

    def __init__(self, session: Session, call: Call) -> None:
        self.session, self.call = session, call


class _Slots:
    """A bound on calls in flight; waiting is cheap when there is room (the common case).

    The waiters are bounded too (`max_waiting` calls, `max_waiting_bytes` of their arguments).
    """

    def __init__(self, size: int, max_waiting: int, max_waiting_bytes: int) -> None:
        self.size = size
        self.used = 0
        self.max_waiting, self.max_waiting_bytes = max_waiting, max_waiting_bytes
        self.waiting_bytes = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def room_to_wait(self, size: int) -> bool:
        return len(self._waiters) < self.max_waiting and self.waiting_bytes + size <= self.max_waiting_bytes

    def try_acquire(self) -> bool:
        if self.used < self.size and not self._waiters:
            self.used += 1
            return True
        return False

    async def acquire(self, timeout: float, size: int = 0) -> bool:
        if self.used < self.size and not self._waiters:
            self.used += 1
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.waiting_bytes += size
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting_bytes -= size
            if not fut.done() or fut.cancelled():
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over: `used` stays the same
                return
        self.used -= 1


class BundleRunner:
    """A supervised child. `run()` is owned by the node's task group; `call()` by a request."""

    def __init__(
        self,
        spec: RunnerSpec,
        on_tools: Callable[[BundleRunner], None] = lambda b: None,
        reaper: Reaper | None = None,
        on_progress: Callable[[BundleRunner, msgspec.Raw], None] | None = None,
    ) -> None:
        self.spec = spec
        self._on_progress = on_progress  # a child's notifications/progress, for the caller that asked
        self._reaper = reaper
        self.key = spec.key
        # Its own cgroup per runner, not per bundle: during an in-place upgrade the old runner's
        # stop kills its cgroup while the new runner's child of the same bundle already serves.
        self._cgroup_key = f"{self.key}.{next(_RUNNER_SERIAL)}"
        self._on_tools = on_tools
        self.state = "starting"  # from creation: run() is about to start it
        self.tools: dict[str, Tool] = {}
        self.pid: int | None = None
        self.restarts = 0
        self.calls = 0
        self.last_exit: str | None = None
        self.last_error: str | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._session: Session | None = None
        self._child: ChildProcess | None = None
        self._slots = _Slots(spec.max_in_flight, spec.max_waiting, spec.max_waiting_bytes)
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()  # reset or stop requested
        self._relist = asyncio.Event()
        self._stopping = False
        self._restart_requested = False
        self._recent: collections.deque[float] = collections.deque()
        self._failures = 0
        self._log_budget = LogBudget(self.key, "stderr lines")
        self._call_timed_out_at = float("-inf")  # loop clock: the last call the child did not answer in time
        self._child_spec: ChildSpec | None = None if spec.prepare else spec.child
        self.finished = asyncio.Event()  # run() has ended: its child is gone

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

    async def settle(self, deadline: float) -> None:
        """Wait while a start is in progress (until `deadline`, loop clock): a start is ridden over."""
        loop = asyncio.get_running_loop()
        while self.state in STARTING_STATES:
            changed = self._changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return

    async def _wait_ready(self, deadline: float, tool_json: bytes, timeout_ms: int = 0) -> Session:
        # Any state but a start is down: answered at once. A start past the deadline is a 504.
        await self.settle(deadline)
        if self.state == "ready" and self._session is not None:
            return self._session
        if self.state in STARTING_STATES:
            raise self.start_timed_out(tool_json.decode(), timeout_ms)
        raise self.unavailable()

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
        self._restart_requested = True
        if self.state == "ready":
            self._set_state("restarting")  # status says so; new calls wait for the new child
        if self.spec.prepare is not None and self.state == "failed":
            self._child_spec = None  # build again: the operator may have fixed the source
        self._recent.clear()
        self._failures = 0
        self._wake.set()
        if self._child is not None and self._child.running:
            self._child.close_stdin()

    async def drain(self, timeout: float) -> None:
        """Wait (at most `timeout`) until no call is in flight on this bundle."""
        with anyio.move_on_after(timeout):
            while self._slots.used > 0:
                await anyio.sleep(0.01)

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def status(self) -> BundleStatus:
        return BundleStatus(
            module=self.spec.module,
            bundle=self.spec.name,
            language=self.spec.language,
            state=self.state,
            pid=self.pid,
            restarts=self.restarts,
            tools=sorted(self.tools),
            last_exit=self.last_exit,
            last_error=self.last_error,
            protocol_version=self._session.protocol_version if self._session else None,
            in_flight=self._session.in_flight if self._session else 0,
            calls=self.calls,
            stderr_tail=list(self.stderr_tail),
        )

    # --- supervision ----------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def run(self) -> None:
        """Supervise until stop(); never raises for anything a child does."""
        policy = self.spec.restart
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                if self._child_spec is None and not await self._prepare():
                    await self._sleep_until_woken(None)
                    continue
                ready_at = await self._run_once()
                if self._stopping:
                    break
                if self._restart_requested:
                    self._restart_requested = False
                    self.restarts += 1
                    continue
                now = loop.time()
                if ready_at is not None and now - ready_at >= policy.stable_after_s:
                    self._failures = 0
                self._recent.append(now)
                while self._recent and now - self._recent[0] > policy.window_s:
                    self._recent.popleft()
                if len(self._recent) > policy.max_restarts:
                    self._set_state("failed")
                    log.error(
                        "bundle %s failed: %d restarts within %.0f s; last exit: %s; last error: %s; "
                        "it stays down until `meshctl node restart %s`",
                        self.key,
                        len(self._recent) - 1,
                        policy.window_s,
                        self.last_exit,
                        self.last_error,
                        self.key,
                    )
                    await self._sleep_until_woken(None)
                    continue
                delay = 0.0
                if self._failures > 0:
                    base = min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** (self._failures - 1))
                    delay = base * random.uniform(0.5, 1.0)
                self._failures += 1
                if delay > 0:
                    self._set_state("backoff")
                    log.warning("bundle %s restarts in %.2f s (%s)", self.key, delay, self.last_exit)
                    await self._sleep_until_woken(delay)
                if not self._stopping:
                    self.restarts += 1
        finally:
            self._set_state("stopped")
            self.finished.set()

    async def _prepare(self) -> bool:
        assert self.spec.prepare is not None
        self._set_state("building")
        failure: Exception | None = None
        # A stop or an operator restart interrupts the build at once (it is not waited out).
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_stop, tg.cancel_scope)
            try:
                self._child_spec = await self.spec.prepare()
            except Exception as e:  # a build's failure is the bundle's, never the node's
                failure = e
            tg.cancel_scope.cancel()
        if failure is not None:
            self.last_error = f"could not be built: {failure}"
            self._set_state("failed")
            log.error("bundle %s %s; fix it, then `meshctl node restart %s`", self.key, self.last_error, self.key)
        return self._child_spec is not None

    async def _sleep_until_woken(self, delay: float | None) -> None:
        self._wake.clear()
        if self._stopping:
            return
        if self._restart_requested:
            self._restart_requested = False  # asked for already: no sleep, and consumed here
            return
        with anyio.move_on_after(delay):
            await self._wake.wait()
        if self._restart_requested:
            self._restart_requested = False

    async def _run_once(self) -> float | None:
        """Start one child and serve until it exits. Returns when it became ready, if it did."""
        self._set_state("starting")
        spec = self.spec
        assert self._child_spec is not None
        self._child_spec = child_spec = self._here(self._child_spec)
        session = Session(self.key, self._notification)
        try:
            child = await ChildProcess.spawn(child_spec, session.feed, self._stderr_line)
        except OSError as e:
            self.last_error = f"cannot start {child_spec.argv[0]}: {e.strerror or e}"
            self.last_exit = "did not start"
            log.error("bundle %s: %s", self.key, self.last_error)
            return None
        session.attach(child.write)
        if self._reaper is not None:
            self._reaper.register(child.pid)
        self._child, self.pid = child, child.pid
        ready_at: float | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_exit, child, tg.cancel_scope)
                # From the first line on: a stop or restart does not wait out the handshake.
                tg.start_soon(self._watch_stop, tg.cancel_scope)
                try:
                    await session.initialize(spec.health.init_timeout_s)
                    tools = await session.list_tools(spec.health.init_timeout_s)
                except (CallTimedOut, ProtocolError, ChildError, SessionClosed) as e:
                    self.last_error = f"did not complete the MCP handshake: {_reason(e)}"
                    log.error("bundle %s %s", self.key, self.last_error)
                    tg.cancel_scope.cancel()
                    return None
                self._session = session
                self._set_tools(tools)
                self._set_state("ready")
                ready_at = asyncio.get_running_loop().time()
                log.info(
                    "bundle %s ready: pid %d, MCP %s, %d tools",
                    self.key,
                    child.pid,
                    session.protocol_version,
                    len(tools),
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

    def _here(self, spec: ChildSpec) -> ChildSpec:
        """The child's spec with the node's bound on its stdin and this bundle's cgroup, if any."""
        cgroups = self._reaper.cgroups if self._reaper is not None else None
        cgroup = spec.cgroup or (cgroups.for_bundle(self._cgroup_key) if cgroups is not None else None)
        limit = self.spec.health.max_stdin_bytes
        if spec.cgroup == cgroup and spec.max_stdin_bytes == limit:
            return spec
        return dataclasses.replace(spec, cgroup=cgroup, max_stdin_bytes=limit)

    async def _last_words(self, child: ChildProcess) -> None:
        """A child that never became ready usually said why on stderr: put that in last_error."""
        with anyio.move_on_after(0.2):
            await asyncio.shield(child.stderr_closed)
        if self.stderr_tail:
            last = self.stderr_tail[-1].strip()
            base = (self.last_error or "").split("; it said: ")[0]
            if last and last not in base:
                self.last_error = f"{base}; it said: {last}" if base else f"it said: {last}"

    async def _watch_exit(self, child: ChildProcess, scope: anyio.CancelScope) -> None:
        await child.wait()
        scope.cancel()

    async def _watch_stop(self, scope: anyio.CancelScope) -> None:
        while not (self._stopping or self._restart_requested):
            self._wake.clear()
            await self._wake.wait()
        scope.cancel()

    async def _end_child(self, child: ChildProcess, session: Session) -> None:
        if child.running:
            status = await child.stop(self.spec.health.stop_grace_s)
        else:
            status = await child.wait()
        self.last_exit = describe_exit(status)
        if child.broken_reason:
            self.last_error = child.broken_reason
        self._session = None
        self.pid = None
        self._child = None
        # Calls in flight learn now, not at their timeout.
        session.close(self.unavailable(f"the child ended ({self.last_exit})"))
        child.close()
        if self._reaper is not None:
            self._reaper.unregister(child.pid)
            if self._child_spec is not None and self._child_spec.cgroup:
                kill_cgroup(self._child_spec.cgroup)  # everything it started, marker or not
                if self._stopping:
                    remove_cgroup(self._child_spec.cgroup)  # if still busy, the node's stop removes it
            # Grandchildren that left the group (setsid) still carry the run's marker.
            also = (f"MESH_MODULE={self.spec.module}", f"MESH_BUNDLE={self.spec.name}")
            # And this version's folder: during an upgrade in place the new version's child carries
            # the same module and bundle, and must not be killed with the old one's leftovers.
            folder = self.spec.child.env.get("MESH_BUNDLE_DIR")
            kill_marked(self._reaper.marker, (*also, f"MESH_BUNDLE_DIR={folder}") if folder else also)
        if not self._stopping and not self._restart_requested:
            log.warning("bundle %s: child %d ended: %s", self.key, child.pid, self.last_exit)

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

    def _notification(self, method: str, params: msgspec.Raw) -> None:
        if method == "notifications/tools/list_changed":
            self._relist.set()
        elif method == "notifications/progress" and self._on_progress is not None:
            self._on_progress(self, params)

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
        self._on_tools(self)

    def _stderr_line(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        self.stderr_tail.append(text)
        if self._log_budget.take():
            log.info("[%s] %s", self.key, text)


def _reason(e: Exception) -> str:
    if isinstance(e, CallTimedOut):
        return f"no answer to {e.what} within {e.timeout_ms} ms"
    if isinstance(e, (ProtocolError, SessionClosed)):
        return e.reason
    if isinstance(e, BundleUnavailable):
        return f"the child ended ({e.last_exit})"
    return str(e)
