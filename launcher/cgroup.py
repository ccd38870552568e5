"""A cgroup (v2) per bundle, where the node may make them: the strongest way to end a bundle.

A grandchild that leaves the child's process group with setsid() and drops its environment
(so it carries no run marker) escapes the process group kill and the marker scan; it cannot
leave its cgroup. Where the node's own cgroup is writable (root, or delegated to its user, e.g.
systemd's `Delegate=yes`) and the kernel has `cgroup.kill` (Linux 5.14), each bundle's child is
started in `<node's cgroup>/mesh-<run id>/<module>.<bundle>.<runner serial>`, and that cgroup is killed whole
when the child ends. Elsewhere `Cgroups.create` says why not, and the weaker guarantees hold.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

KILL = "cgroup.kill"


def own_cgroup_dir(proc: Path = Path("/proc/self")) -> tuple[Path | None, str]:
    """The folder of this process's cgroup v2 in the mounted hierarchy, or None and why not."""
    try:
        line = next((x for x in (proc / "cgroup").read_text().splitlines() if x.startswith("0::")), None)
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError as e:
        return None, f"cannot read /proc: {e.strerror}"
    if line is None:
        return None, "this process is in no cgroup v2 hierarchy"
    for mount in mounts:
        # mountinfo: id parent major:minor root mount-point options ... - fstype source options
        left, _, right = mount.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            fields = left.split(" ")
            if fields[3] == "/":
                return Path(fields[4]) / line[3:].lstrip("/"), ""
    return None, "no cgroup v2 hierarchy is mounted"


class Cgroups:
    """The node's cgroups for this run: one folder under its own cgroup, one inside it per bundle."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def create(cls, run_id: str) -> tuple[Cgroups | None, str]:
        """The run's cgroup folder, made now; or None and the reason a bundle gets no cgroup here."""
        own, why = own_cgroup_dir()
        if own is None:
            return None, why
        base = own / f"mesh-{run_id}"
        try:
            base.mkdir()
        except OSError as e:
            return None, f"cannot create a cgroup under {own}: {e.strerror} (not delegated to this user)"
        if not (base / KILL).exists():
            _remove(base)
            return None, f"the kernel has no {KILL} (Linux 5.14 or later)"
        return cls(base), ""

    def for_bundle(self, key: str) -> str | None:
        """The cgroup a bundle's child starts in (made when missing), or None when it cannot be made."""
        path = self.base / key.replace("/", ".")
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        return str(path)

    def close(self) -> None:
        """Kill whatever is left in any bundle's cgroup and remove the folders."""
        kill_tree(self.base)


def joiner(cgroup: str) -> Callable[[], None]:
    """A preexec step: the new process moves itself into `cgroup` before it execs the child."""
    procs = os.path.join(cgroup, "cgroup.procs")

    def join() -> None:
        try:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError:
            pass  # the weaker guarantees (group, marker) still hold; a failed start would be worse

    return join


def place(cgroup: str, pid: int) -> None:
    """Move `pid` into `cgroup` from the node's side: for a child run as another user, whose own
    join between fork and exec is refused (it has given up root by then). Idempotent."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        pass  # it has already ended, or the cgroup is gone


def kill(cgroup: str) -> None:
    """SIGKILL every process in the cgroup and below it, at once (the kernel's cgroup.kill)."""
    try:
        with open(os.path.join(cgroup, KILL), "w") as f:
            f.write("1")
    except OSError:
        pass


def kill_tree(base: Path, wait: float = 2.0) -> None:
    """Kill everything under `base`, then remove its folders once the kernel has emptied them."""
    if not base.is_dir():
        return
    kill(str(base))
    deadline = time.monotonic() + wait
    for folder in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [base]:
        while not _remove(folder) and time.monotonic() < deadline:
            time.sleep(0.01)


def _remove(folder: Path) -> bool:
    try:
        folder.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def remove(cgroup: str) -> bool:
    """Remove a cgroup's folder now if the kernel has emptied it (no waiting)."""
    return _remove(Path(cgroup))


def members(cgroup: str) -> list[int]:
    """The pids in a cgroup (not below it)."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
