"""The transport: one child process, its pipes, and how it ends.

The child runs in its own process group and gets SIGKILL when the runtime dies (parent-death
signal), so a stop or restart can end the whole group: no orphan, no zombie. Pipes are read
by an asyncio protocol that hands over whole lines; the read size is capped because asyncio's
default of 256 KiB per read costs tens of microseconds per small message.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import grp
import os
import pwd
import shutil
import signal
import subprocess
import warnings
from dataclasses import dataclass, field
from typing import Callable

import anyio
import anyio.to_thread

from . import sandbox
from .cgroup import joiner, place
from .sandbox import Confinement

READ_SIZE = 64 * 1024
PR_SET_PDEATHSIG = 1

LineHandler = Callable[[bytes], None]


@dataclass(frozen=True)
class ChildSpec:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    # Run as another user/group when the node is configured so (needs root).
    user: int | str | None = None
    group: int | str | None = None
    # A line longer than this is a broken child, not a message to buffer for ever.
    max_line_bytes: int = 64 * 1024 * 1024
    # Bytes written to the child's stdin that it has not read yet. A child past this does not
    # read its stdin: it is hung, and is killed (without a bound the node grew by GB a second).
    # Checked before each write: one message larger than the bound still goes to a child that
    # has read everything before it.
    max_stdin_bytes: int = 32 * 1024 * 1024
    # A cgroup (v2) folder the child starts in (launcher/cgroup.py), where the node can make them.
    cgroup: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    # What the child may reach (launcher/sandbox.py); None: what its user may (said in status).
    confinement: Confinement | None = None


def use_pidfd_child_watcher() -> None:
    """Python 3.11 waits for each child in a thread of its own; a pidfd per child is cheaper."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(asyncio, "PidfdChildWatcher") and not isinstance(
            asyncio.get_child_watcher(), asyncio.PidfdChildWatcher
        ):
            try:
                watcher = asyncio.PidfdChildWatcher()
                asyncio.set_child_watcher(watcher)
                watcher.attach_loop(asyncio.get_running_loop())
            except (OSError, NotImplementedError):
                pass


class LineTooLong(Exception):
    pass


@functools.cache
def _setpriv() -> str | None:
    """util-linux's setpriv, when it can set the parent-death signal (2.33 and later).

    Asked once, at the first spawn, not when the module is imported."""
    found = shutil.which("setpriv")
    if found is None:
        return None
    try:
        ok = (
            subprocess.run([found, "--pdeathsig", "KILL", "--", "true"], capture_output=True, timeout=5).returncode == 0
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found if ok else None


def _check_runnable(program: str, path: str | None) -> None:
    """Raise the OSError exec would raise for a missing or non-executable program."""
    found = program if "/" in program else shutil.which(program, path=path)
    if found is None or not os.path.isfile(found):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if not os.access(found, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


def _die_with_parent(parent: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl; then nobody would signal us.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _preexec(die_with_parent: Callable[[], None] | None, cgroup: str | None) -> Callable[[], None] | None:
    """What runs between fork and exec: only when needed (without it Python spawns with vfork)."""
    if cgroup is None:
        return die_with_parent
    join = joiner(cgroup)
    if die_with_parent is None:
        return join

    def both() -> None:
        join()
        die_with_parent()

    return both


class _Lines:
    """Splits a byte stream into lines without copying the common case (whole lines).

    A long line arrives in many reads: its pieces are kept in a list and joined once, at its
    end, so a 40 MB answer costs one copy, not one per read. A handler that fails on one line
    with an OSError (a broken pipe while answering the child) costs that line only, never the
    rest of the read.
    """

    __slots__ = ("parts", "size", "handler", "limit")

    def __init__(self, handler: LineHandler, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.handler = handler
        self.limit = limit

    def feed(self, data: bytes) -> None:
        end = data.find(b"\n")
        if end < 0:
            self.parts.append(data)
            self.size += len(data)
            if self.size > self.limit:
                self.parts, self.size = [], 0
                raise LineTooLong(f"a line of more than {self.limit} bytes")
            return
        handler = self.handler
        if self.parts:
            self.parts.append(data[:end])
            line = b"".join(self.parts)
            self.parts, self.size = [], 0
        else:
            line = data[:end]
        try:
            handler(line)
        except OSError:
            pass  # the child's stdin closed while it was answered: the next lines still count
        start = end + 1
        find = data.find
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            try:
                handler(data[start:end])
            except OSError:
                pass
            start = end + 1
        if start < len(data):
            self.parts.append(data[start:])
            self.size = len(data) - start

    def flush(self) -> None:
        if self.parts:
            rest = b"".join(self.parts)
            self.parts, self.size = [], 0
            self.handler(rest)


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, child: ChildProcess) -> None:
        self.child = child

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        # Known from the first callback: a child that dies at once can exit before
        # subprocess_exec returns, and its exit must still find the transport.
        self.child._transport = transport
        self.child.pid = transport.get_pid()
        for fd in (1, 2):
            pipe = transport.get_pipe_transport(fd)
            if pipe is not None and hasattr(pipe, "max_size"):
                pipe.max_size = READ_SIZE

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        child = self.child
        if fd == 1:
            try:
                child._stdout.feed(data)
            except LineTooLong as e:
                child._broken(str(e))
            if child._stdout.parts:
                # Alive in the middle of a long line; whole lines count as alive only when they
                # are JSON-RPC (the session's last_seen): garbage is no sign of life.
                child.last_output = child._loop.time()
        else:
            try:
                child._stderr.feed(data)
            except LineTooLong:
                child._stderr.flush()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.child._stdout.flush()
        elif fd == 2:
            self.child._stderr.flush()
            if not self.child.stderr_closed.done():
                self.child.stderr_closed.set_result(None)

    def process_exited(self) -> None:
        self.child._on_exit()


def _identity(user: int | str | None, group: int | str | None) -> tuple[int | str | None, list[int] | None]:
    """(group, supplementary groups) for a child run as `user`: the user's own, never the node's.

    Without this, subprocess changes only the uid: the child would keep root's gid and groups.
    """
    if user is None:
        return group, None
    pw = pwd.getpwnam(user) if isinstance(user, str) else pwd.getpwuid(user)
    gid = pw.pw_gid if group is None else (grp.getgrnam(group).gr_gid if isinstance(group, str) else group)
    return gid, os.getgrouplist(pw.pw_name, gid)


class ChildProcess:
    """A running child; `exited` resolves with its exit status (negative: killed by signal)."""

    def __init__(self, on_stdout: LineHandler, on_stderr: LineHandler, spec: ChildSpec) -> None:
        self._stdout = _Lines(on_stdout, spec.max_line_bytes)
        self._stderr = _Lines(on_stderr, 64 * 1024)
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self.pid: int = 0
        self._loop = asyncio.get_running_loop()
        self.last_output = self._loop.time()
        self._out: list[bytes] = []
        self._stdin_limit = spec.max_stdin_bytes
        self._turn_open = False
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.stderr_closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.broken_reason: str | None = None
        self.confinement = "none: not asked for"  # what it runs with, in one line (sandbox.describe)

    @classmethod
    async def spawn(cls, spec: ChildSpec, on_stdout: LineHandler, on_stderr: LineHandler) -> ChildProcess:
        loop = asyncio.get_running_loop()
        child = cls(on_stdout, on_stderr, spec)
        group, extra_groups = _identity(spec.user, spec.group)
        env = spec.env
        confinement = spec.confinement
        support = None
        if confinement is not None:
            if not sandbox.is_ready(spec.user, spec.group):  # the first time only: a probe (and maybe a build)
                await anyio.to_thread.run_sync(sandbox.support, spec.user, spec.group)
            support = sandbox.support(spec.user, spec.group)
            if support.helper is None and not confinement.required:
                # No helper at all ([sandbox] required = false): run as an unconfined child, said.
                child.confinement = sandbox.describe(confinement, support)
                confinement = None
        if confinement is not None and support is not None:
            # The sandbox helper sets the parent-death signal, confines, then execs the child in
            # place (same pid): no preexec_fn, so Python still spawns with vfork.
            prefix = sandbox.helper_argv(confinement, support, os.getpid())  # SandboxUnavailable: not started
            _check_runnable(spec.argv[0], spec.env.get("PATH"))
            sandbox.prepare_folders(confinement, spec.user, group)
            env = {**spec.env, "TMPDIR": confinement.tmp_dir}
            argv = [*prefix, "--", *spec.argv]
            preexec = _preexec(None, spec.cgroup)
            child.confinement = sandbox.describe(confinement, support)
        else:
            # The parent-death signal is set by setpriv, which then execs the child in place (same
            # pid): without a preexec_fn, Python spawns with vfork, 2.7 ms -> 0.8 ms a child for a
            # node-sized process. Without setpriv, a preexec_fn sets it (and the reaper covers both).
            setpriv = _setpriv()
            if setpriv:
                _check_runnable(spec.argv[0], spec.env.get("PATH"))  # what exec would say, said here
            argv = [setpriv, "--pdeathsig", "KILL", "--", *spec.argv] if setpriv else spec.argv
            preexec = _preexec(None if setpriv else _die_with_parent(os.getpid()), spec.cgroup)
        transport, _ = await loop.subprocess_exec(
            lambda: _Protocol(child),
            *argv,
            cwd=spec.cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
            user=spec.user,
            group=group,
            extra_groups=extra_groups,
            close_fds=True,
            umask=0o077,  # what a child writes (its store, its files) is its own user's alone
        )
        child._transport = transport
        child._stdin = transport.get_pipe_transport(0)  # type: ignore[assignment]
        child.pid = transport.get_pid()
        if spec.cgroup is not None and spec.user is not None:
            # Run as another user, it could not join by itself (uid changed before the preexec
            # step): moved right after its exec, before it has done anything much.
            place(spec.cgroup, child.pid)
        return child

    def write(self, data: bytes) -> None:
        """Send a message. The first in a turn of the event loop goes at once (no added
        latency); the others of the same turn are joined into one write at its end."""
        stdin = self._stdin
        if stdin is None or stdin.is_closing():
            raise BrokenPipeError("the child's stdin is closed")
        if self._turn_open:
            self._out.append(data)
            return
        if stdin.get_write_buffer_size() > self._stdin_limit:
            self._stdin_full(stdin)
        stdin.write(data)
        self._turn_open = True
        self._loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._turn_open = False
        if self._out:
            out, self._out = self._out, []
            stdin = self._stdin
            if stdin is not None and not stdin.is_closing():
                if stdin.get_write_buffer_size() > self._stdin_limit:
                    self._stdin_full(stdin, raise_it=False)
                    return
                stdin.write(b"".join(out))

    def _stdin_full_reason(self) -> str:
        return f"does not read its stdin: more than {self._stdin_limit} bytes written to it are unread (killed as hung)"

    def _stdin_full(self, stdin: asyncio.WriteTransport, raise_it: bool = True) -> None:
        self._out = []
        self._broken(self._stdin_full_reason())
        stdin.close()  # nothing more is queued for a child that is being killed
        if raise_it:
            raise BrokenPipeError(f"the child {self._stdin_full_reason()}")

    async def wait(self) -> int:
        """The exit status. Shielded: a cancelled waiter must not cancel the shared future."""
        return await asyncio.shield(self.exited)

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def close_stdin(self) -> None:
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()

    def signal_group(self, sig: int) -> None:
        """Signal the whole process group: grandchildren go with the child."""
        if self.pid:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def stop(self, grace: float = 2.0, *, ask_first: bool = True) -> int:
        """Close stdin (the MCP way to say "exit"), then SIGTERM, then SIGKILL, to the group.

        Without `ask_first` (a service, which reads nothing from the node) SIGTERM goes at once."""
        self.close_stdin()
        if not ask_first:
            self.signal_group(signal.SIGTERM)
        for sig in (signal.SIGTERM, signal.SIGKILL) if ask_first else (signal.SIGKILL,):
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), grace)
                break
            except TimeoutError:
                self.signal_group(sig)
        status = await self.wait()
        # The leader is gone; whatever it left in its group goes too.
        self.signal_group(signal.SIGKILL)
        return status

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)

    def _broken(self, reason: str) -> None:
        self.broken_reason = reason
        self.kill()

    def _on_exit(self) -> None:
        code = self._transport.get_returncode() if self._transport is not None else None
        # Grandchildren left in the group do not outlive their parent's restart.
        self.signal_group(signal.SIGKILL)
        if not self.exited.done():
            self.exited.set_result(code if code is not None else -1)

    def close(self) -> None:
        """Let go of the pipes once the child has exited and its last output was read."""
        if self._transport is not None:
            self._transport.close()
