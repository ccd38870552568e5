"""A watchdog process that ends every child's process group when the runtime dies.

The parent-death signal reaches a child, not its grandchildren; a runtime killed with SIGKILL
cannot clean up. So the runtime starts this small stdlib-only process with a pipe: it writes
"+PGID" when a child starts and "-PGID" when it is gone. When the pipe closes (the runtime
exited, however it exited), the watchdog kills every group still registered, then every
process that still carries this run's marker in its environment (`MESH_RUN=<id>`, inherited
by grandchildren even when they left the group with setsid), then the run's cgroup (with
everything in it, marker or not) when the node could make one, then exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

if __package__:  # run as the watchdog (`python -I -S reaper.py`) it needs the standard library only
    from .cgroup import Cgroups

log = logging.getLogger("mesh.reaper")

MARKER_VAR = "MESH_RUN"


def find_marked(marker: str, also: tuple[str, ...] = ()) -> list[int]:
    """Pids whose environment holds MESH_RUN=<marker> (and every `also` entry, "K=V")."""
    want = [f"{MARKER_VAR}={marker}".encode(), *(a.encode() for a in also)]
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        if all(w in entries for w in want):
            found.append(int(name))
    return found


def kill_marked(marker: str, also: tuple[str, ...] = ()) -> int:
    pids = find_marked(marker, also)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


class Reaper:
    """The runtime's side: start the watchdog, tell it about process groups."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self._proc: asyncio.subprocess.Process | None = None
        self.cgroups: Cgroups | None = None
        self.no_cgroups_because = ""

    async def start(self, cgroups: bool = True) -> None:
        if cgroups:
            self.cgroups, self.no_cgroups_because = Cgroups.create(self.marker)
        if self.cgroups is not None:
            log.info("each bundle runs in a cgroup of its own under %s", self.cgroups.base)
        else:
            log.info("bundles get no cgroup of their own here (%s)", self.no_cgroups_because or "not asked for")
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            __file__,
            self.marker,
            str(self.cgroups.base) if self.cgroups else "",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            # Its own session: a signal to the runtime's group (Ctrl-C) must not end it first.
            start_new_session=True,
            env={},  # -I -S: it needs nothing, and a same-user child must not find the node's secrets here
        )

    def _send(self, line: str) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.write(line.encode() + b"\n")

    def register(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        self._proc = None
        if self.cgroups is not None:
            self.cgroups.close()


def main() -> None:
    groups: set[int] = set()
    # Ctrl-C or SIGTERM to the runtime's group must not end the watchdog before its work.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            pgid = int(line[1:])
        except ValueError:
            continue
        if line[:1] == b"+":
            groups.add(pgid)
        elif line[:1] == b"-":
            groups.discard(pgid)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if len(sys.argv) > 1 and sys.argv[1]:
        kill_marked(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2]:
        _kill_cgroup(sys.argv[2])


def _kill_cgroup(base: str) -> None:
    """cgroup.kill on the run's cgroup, then its folders, deepest first (stdlib only: run alone)."""
    try:
        with open(os.path.join(base, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:
        return
    folders = [d for d, _, _ in os.walk(base)][::-1]
    for _ in range(200):  # the kernel empties them within milliseconds
        folders = [d for d in folders if not _rmdir(d)]
        if not folders:
            return
        time.sleep(0.01)


def _rmdir(folder: str) -> bool:
    try:
        os.rmdir(folder)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
