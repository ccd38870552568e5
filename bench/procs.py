"""Processes the benchmark starts and what it reads about them from /proc.

Every process is started in its own process group and ended by that group at the end of the
run, so nothing outlives the benchmark (a child of a peer goes with its peer).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what or proc.args} exited with code {proc.returncode} before listening on {port}")
        time.sleep(0.02)
    raise RuntimeError(f"{what or 'nothing'} did not listen on 127.0.0.1:{port} within {timeout:g} s")


class Proc:
    """A process of the benchmark's own, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], log: Path, *, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None) -> None:
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic_ns()
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, cwd=cwd, start_new_session=True,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the group, then SIGKILL: nothing of it is left behind."""
        if self.popen.poll() is None:
            _killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        _killpg(self.pid, signal.SIGKILL)  # whatever it left in its group
        if self.popen.poll() is None:
            self.popen.wait(10)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def cpu_ns(pid: int) -> int:
    """CPU time of a process (all its threads), in nanoseconds.

    Each thread's schedstat gives its run time in ns; the clock-tick utime+stime of /proc/<pid>/stat
    (10 ms steps) is the fallback where schedstat is missing.
    """
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # the thread ended between the listing and the read
    if total:
        return total
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _TICK
    except (OSError, IndexError, ValueError):
        return 0


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_facts(pid: int) -> tuple[list[str], str, dict[str, str]]:
    """argv, cwd and environment of a running process: how to start exactly the same child."""
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    cwd = os.readlink(f"/proc/{pid}/cwd")
    env: dict[str, str] = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode(errors="replace").partition("=")
            env[k] = v
    return argv, cwd, env


def newest_descendant(pid: int, needle: str) -> int | None:
    """The youngest process under `pid` whose command line holds `needle` (a peer's child)."""
    found: list[tuple[int, int]] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            todo.append(kid)
            try:
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{kid}/stat") as f:
                    started = int(f.read().rsplit(")", 1)[1].split()[19])
            except (OSError, IndexError, ValueError):
                continue
            if needle in cmdline and "sh -c" not in cmdline:
                found.append((started, kid))
    return max(found)[1] if found else None
