"""The bound on what the toolchains keep between builds, and the lock a build holds on it.

A toolchain keeps a folder per key (Rust: a scratch workspace and cargo target per Rust release
and Cargo.lock; TypeScript: a scratch with installed packages per set of package files). Keys
come and go with every lock file change, so without a bound the cache only grows. Each kept
folder has a lock file: a build holds it while it uses the folder, and taking it stamps the
file's modification time, which is the folder's last use. Before a build, `prune` removes:
- folders unused for longer than `max_age_days`;
- then the least recently used, while the toolchain's folders together exceed `max_size_gb`;
- folders of an older layout that no build uses any more (given by the toolchain).
A folder whose lock is held (a build is using it right now, this one included) is never
removed. Every removal is logged with what was removed, its size and why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence

import msgspec

GB = 1024**3
DAY_S = 86400.0


class CacheBound(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How much the toolchains keep between builds (the node config's `[build_cache]` table)."""

    max_age_days: float = 14.0  # a kept folder unused this long is removed
    max_size_gb: float = 10.0  # per toolchain: beyond it the least recently used folders go


def bound_problem(bound: CacheBound) -> str | None:
    """What is wrong with a bound that parses, or None."""
    if not bound.max_age_days > 0:
        return f"build_cache.max_age_days: is {bound.max_age_days}; write a number of days above 0, e.g. 14"
    if not bound.max_size_gb > 0:
        return f"build_cache.max_size_gb: is {bound.max_size_gb}; write a size in GB above 0, e.g. 10"
    return None


@dataclass(frozen=True)
class Kept:
    """A folder kept between builds and the lock file a build holds while using it."""

    folder: Path
    lock: Path


@contextmanager
def holding(kept: Kept, on_wait: Callable[[], None] = lambda: None) -> Iterator[IO[str]]:
    """Hold `kept`'s lock for a build, waiting for another build that holds it (`on_wait` says so).

    Taking it stamps the lock file: its modification time is the folder's last use. A lock file
    that `prune` removed while this build waited for it is not the one at the path any more:
    take the new one instead, so two builds never share a folder unlocked."""
    while True:
        kept.lock.parent.mkdir(parents=True, exist_ok=True)
        lock = open(kept.lock, "a")
        try:
            if not _try_lock(lock):
                on_wait()
                fcntl.flock(lock, fcntl.LOCK_EX)
            if _same_file(lock, kept.lock):
                os.utime(kept.lock)
                break
        except BaseException:
            lock.close()
            raise
        lock.close()
    try:
        yield lock
    finally:
        lock.close()


def prune(
    kept: list[Kept], bound: CacheBound, log: Callable[[str], None], *, old_layout: Sequence[Kept] = (), now: float = 0
) -> list[Path]:
    """Remove what the bound says to (see the module's docstring); return the folders removed."""
    now = now or time.time()
    removed: list[Path] = []
    for item in old_layout:
        if _remove(item, log, "a folder of an older cache layout, which no build uses any more", None):
            removed.append(item.folder)
    live: list[tuple[float, int, Kept]] = []  # (last use, size, folder)
    for item in kept:
        used = _last_use(item)
        if used is None:
            continue  # removed by another build just now
        idle_days = (now - used) / DAY_S
        if idle_days > bound.max_age_days:
            why = f"unused for {idle_days:.0f} days; build_cache.max_age_days is {bound.max_age_days:g}"
            if _remove(item, log, why, used):
                removed.append(item.folder)
                continue
        live.append((used, _size(item.folder), item))
    total = sum(size for _, size, _ in live)
    limit = bound.max_size_gb * GB
    for used, size, item in sorted(live, key=lambda t: t[0]):  # least recently used first
        if total <= limit:
            break
        why = (
            f"the least recently used, and this toolchain's folders held {_gb(total)}; "
            f"build_cache.max_size_gb is {bound.max_size_gb:g}"
        )
        if _remove(item, log, why, used):
            removed.append(item.folder)
            total -= size
    return removed


def _remove(item: Kept, log: Callable[[str], None], why: str, used: float | None) -> bool:
    """Remove `item` unless a build holds its lock or took it since its last use was read
    (`used`); True when removed."""
    stamped = item.lock.exists()  # else its last use was the folder's time, and opening makes the lock
    try:
        lock = open(item.lock, "a")
    except OSError:
        return False  # its folder is going or gone
    with lock:
        if not _try_lock(lock) or not _same_file(lock, item.lock):
            return False  # a build uses it right now
        if used is not None and stamped and _last_use(item) != used:
            return False  # a build used it since: no longer what the bound said to remove
        size = _size(item.folder)
        shutil.rmtree(item.folder, ignore_errors=True)
        if item.lock.parent != item.folder:
            item.lock.unlink(missing_ok=True)
        log(f"build cache: removed {item.folder} ({_gb(size)}): {why}")
    return True


def _last_use(item: Kept) -> float | None:
    try:
        return item.lock.stat().st_mtime
    except FileNotFoundError:
        try:
            return item.folder.stat().st_mtime  # a lock never taken: the folder's own time
        except FileNotFoundError:
            return None


def _size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass  # removed while counted
    return total


def _gb(size: float) -> str:
    return f"{size / GB:.2f} GB"


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _same_file(lock: IO[str], path: Path) -> bool:
    """Whether the open lock is still the file at `path` (prune removes the files it locked)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(lock.fileno())
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)
