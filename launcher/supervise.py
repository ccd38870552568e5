"""The supervision every child the node runs shares: a loop that starts it, waits for its end,
and starts it again under the restart policy (launcher/restart.py), until stopped.

A tools bundle (launcher/bundle.py: MCP on stdio) and a service bundle the node runs itself
(launcher/service.py: a plain process) differ only in what one life of the child is
(`_run_once`); the states (with `restarting` for an operator's restart), the backoff, `failed`,
the operator's reset, a stop or restart that interrupts a build or a start at once, the stderr
tail (with its log budget), a cgroup per runner and the cleanup of a child's process group,
cgroup and marked processes are here, once.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import signal
import time
from typing import Awaitable, Callable

import anyio
import anyio.abc

from .cgroup import kill as kill_cgroup
from .cgroup import remove as remove_cgroup
from .logbudget import LogBudget
from .process import ChildProcess, ChildSpec
from .reaper import Reaper, kill_marked
from .restart import GiveUp, RestartPolicy, Restarts
from .sandbox import SandboxUnavailable

log = logging.getLogger("mesh.bundle")
_RUNNER_SERIAL = itertools.count(1)
# States in which the child is up; an operator's restart shows `restarting` instead.
UP_STATES = ("ready", "running")

STDERR_TAIL = 50  # lines kept per child for status and error replies


def describe_exit(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit code {status}"


class Supervised:
    """One supervised child. `run()` is owned by the node's task group."""

    def __init__(
        self,
        module: str,
        name: str,
        restart: RestartPolicy,
        child: ChildSpec,
        prepare: Callable[[], Awaitable[ChildSpec]] | None,
        reaper: Reaper | None,
    ) -> None:
        self.module, self.name = module, name
        self.key = f"{module}/{name}"
        self._prepare_child = prepare
        self._reaper = reaper
        self.state = "starting"  # from creation: run() is about to start it
        self.state_since = time.monotonic()  # for status: how long a build or a start has run
        self.pid: int | None = None
        self.restarts = 0
        self.last_exit: str | None = None
        self.last_error: str | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self.confinement = ""  # what its last child ran with (launcher/sandbox.py describe)
        self._child: ChildProcess | None = None
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()  # reset or stop requested
        self._stopping = False
        self._restart_requested = False
        self._restarts = Restarts(restart)
        self._log_budget = LogBudget(self.key, "stderr lines")
        # Its own cgroup per runner, not per bundle: during an in-place upgrade the old runner's
        # stop kills its cgroup while the new runner's child of the same bundle already serves.
        self._cgroup_key = f"{self.key}.{next(_RUNNER_SERIAL)}"
        # The bound on the child's unread stdin (a tools runner's [health] max_stdin_bytes); None
        # keeps the child spec's own.
        self._stdin_limit: int | None = None
        self._child_spec: ChildSpec | None = None if prepare else child
        self.finished = asyncio.Event()  # run() has ended: its child is gone
        # Starts begun (one per spawn), and the last of them that ended without coming up: a call
        # waits for one start, not for the restarts after it (launcher/bundle.py, settle).
        self.starts = 0
        self.failed_start = 0
        self.start_failure = ""  # why that start did not come up

    async def _run_once(self) -> float | None:
        """Start the child once and supervise it until it ends or a stop or reset wakes us;
        returns when it came up (loop clock), if it did."""
        raise NotImplementedError

    # --- operator -------------------------------------------------------------------------
    def request_restart(self) -> None:
        """Operator's reset: a failed child starts again; a running one is restarted."""
        self._restart_requested = True
        if self.state in UP_STATES:
            self._set_state("restarting")  # status says so; calls to a tools bundle wait for the new child
        if self._prepare_child is not None and self.state == "failed":
            self._child_spec = None  # build again: the operator may have fixed the source
        self._restarts.reset()
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    # --- the loop -------------------------------------------------------------------------
    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state_since = time.monotonic()
        self.state = state
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        self._state_changed()

    def _state_changed(self) -> None:
        """Called after every state change; a subclass tells whoever watches (the node's change notice)."""

    def _start_failed(self) -> None:
        """The start in progress ended without the child coming up: whoever waits for it learns now,
        before the child is stopped and the next start is decided (at most once per start)."""
        if self.failed_start == self.starts:
            return
        self.failed_start = self.starts
        self.start_failure = self.last_error or self.last_exit or ""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def run(self) -> None:
        """Supervise until stop(); never raises for anything a child does."""
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                if self._child_spec is None and not await self._prepare():
                    await self._sleep_until_woken(None)
                    continue
                up_since = await self._run_once()
                if self._stopping:
                    break
                if up_since is None and not self._restart_requested:
                    self._start_failed()  # e.g. the child exited during its handshake
                if self._restart_requested:
                    self._restart_requested = False
                    self.restarts += 1
                    continue
                after = self._restarts.after_exit(loop.time(), up_since)
                if isinstance(after, GiveUp):
                    self._set_state("failed")
                    log.error(
                        "bundle %s failed: %d restarts within %.0f s; last exit: %s; last error: %s; "
                        "it stays down until `meshctl node restart %s`",
                        self.key,
                        after.exits,
                        after.window_s,
                        self.last_exit,
                        self.last_error,
                        self.key,
                    )
                    await self._sleep_until_woken(None)
                    continue
                if after > 0:
                    self._set_state("backoff")
                    log.warning("bundle %s restarts in %.2f s (%s)", self.key, after, self.last_exit)
                    await self._sleep_until_woken(after)
                if not self._stopping:
                    self.restarts += 1
        finally:
            self._set_state("stopped")
            self.finished.set()

    async def _prepare(self) -> bool:
        assert self._prepare_child is not None
        self._set_state("building")
        failure: Exception | None = None
        # A stop or an operator restart interrupts the build at once (it is not waited out).
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_stop, tg.cancel_scope)
            try:
                self._child_spec = await self._prepare_child()
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

    async def _watch_stop(self, scope: anyio.CancelScope) -> None:
        while not (self._stopping or self._restart_requested):
            self._wake.clear()
            await self._wake.wait()
        scope.cancel()

    def _watch(self, tg: anyio.abc.TaskGroup, child: ChildProcess) -> None:
        """End `tg` at once when the child exits or a stop or an operator's restart is asked: from
        its first moment on, so a handshake (or anything else the group waits for) is not waited out."""
        tg.start_soon(self._watch_exit, child, tg.cancel_scope)
        tg.start_soon(self._watch_stop, tg.cancel_scope)

    # --- one child ------------------------------------------------------------------------
    async def _spawn(self, on_stdout: Callable[[bytes], None]) -> ChildProcess | None:
        """Start the child (registered with the reaper); None, with the reason kept, when it cannot."""
        self.starts += 1
        self._set_state("starting")
        assert self._child_spec is not None
        self._child_spec = child_spec = self._here(self._child_spec)
        try:
            child = await ChildProcess.spawn(child_spec, on_stdout, self._stderr_line)
        except SandboxUnavailable as e:
            self.confinement = f"refused: {e.reason}"
            self.last_error = f"cannot start {child_spec.argv[0]}: {e}"
            self.last_exit = "did not start"
            log.error("bundle %s: %s", self.key, self.last_error)
            return None
        except OSError as e:
            self.last_error = f"cannot start {child_spec.argv[0]}: {e.strerror or e}"
            self.last_exit = "did not start"
            log.error("bundle %s: %s", self.key, self.last_error)
            return None
        if self._reaper is not None:
            self._reaper.register(child.pid)
        self._child, self.pid = child, child.pid
        self.confinement = child.confinement
        return child

    def _here(self, spec: ChildSpec) -> ChildSpec:
        """The child's spec with the node's bound on its stdin and this runner's cgroup, if any."""
        cgroups = self._reaper.cgroups if self._reaper is not None else None
        cgroup = spec.cgroup or (cgroups.for_bundle(self._cgroup_key) if cgroups is not None else None)
        limit = spec.max_stdin_bytes if self._stdin_limit is None else self._stdin_limit
        if spec.cgroup == cgroup and spec.max_stdin_bytes == limit:
            return spec
        return dataclasses.replace(spec, cgroup=cgroup, max_stdin_bytes=limit)

    def _forget_child(self, child: ChildProcess, status: int) -> None:
        """The child has ended: its exit kept, and nothing it started is left behind."""
        self.last_exit = describe_exit(status)
        if child.broken_reason:
            self.last_error = child.broken_reason
        self.pid = None
        self._child = None
        child.close()
        if self._reaper is not None:
            self._reaper.unregister(child.pid)
            if self._child_spec is not None and self._child_spec.cgroup:
                kill_cgroup(self._child_spec.cgroup)  # everything it started, marker or not
                if self._stopping:
                    remove_cgroup(self._child_spec.cgroup)  # if still busy, the node's stop removes it
            # Grandchildren that left the group (setsid) still carry the run's marker. And this
            # version's folder (as it ran: a build's, for compiled code from source): during an
            # upgrade in place the new version's child carries the same module and bundle, and
            # must not be killed with the old one's leftovers.
            also = (f"MESH_MODULE={self.module}", f"MESH_BUNDLE={self.name}")
            folder = self._child_spec.env.get("MESH_BUNDLE_DIR") if self._child_spec else None
            kill_marked(self._reaper.marker, (*also, f"MESH_BUNDLE_DIR={folder}") if folder else also)
        if not self._stopping and not self._restart_requested:
            log.warning("bundle %s: child %d ended: %s", self.key, child.pid, self.last_exit)

    @staticmethod
    async def _watch_exit(child: ChildProcess, scope: anyio.CancelScope) -> None:
        await child.wait()
        scope.cancel()

    async def _last_words(self, child: ChildProcess) -> None:
        """A child that ended early usually said why on stderr: put that in last_error."""
        with anyio.move_on_after(0.2):
            await asyncio.shield(child.stderr_closed)
        if self.stderr_tail:
            last = self.stderr_tail[-1].strip()
            base = (self.last_error or "").split("; it said: ")[0]
            if last and last not in base:
                self.last_error = f"{base}; it said: {last}" if base else f"it said: {last}"

    def _stderr_line(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        self.stderr_tail.append(text)
        if self._log_budget.take():
            log.info("[%s] %s", self.key, text)
