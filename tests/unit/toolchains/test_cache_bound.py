"""The bound on the toolchains' build cache: unused, oversized and old-layout folders are removed,
never one a build holds, and every removal says what and why."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from runtime.config import ConfigError, load_config
from toolchains import rust, typescript
from toolchains.cache_bound import GB, CacheBound, Kept, holding, prune

DAY = 86400.0


def _folder(path: Path, size: int = 4096, idle_days: float = 0.0, lock_inside: bool = False) -> Kept:
    """A kept folder holding `size` bytes, last used `idle_days` ago."""
    path.mkdir(parents=True)
    (path / "data").write_bytes(b"x" * size)
    kept = Kept(path, path / ".lock" if lock_inside else path.with_name(path.name + ".lock"))
    kept.lock.touch()
    when = time.time() - idle_days * DAY
    os.utime(kept.lock, (when, when))
    return kept


def test_a_folder_unused_past_the_age_bound_is_removed_and_said(tmp_path: Path) -> None:
    old = _folder(tmp_path / "ts-shared-old", idle_days=20)
    recent = _folder(tmp_path / "ts-shared-recent", idle_days=2)
    said: list[str] = []
    removed = prune(typescript._kept(tmp_path), CacheBound(max_age_days=14), said.append)
    assert removed == [old.folder.resolve()]
    assert not old.folder.exists() and not old.lock.exists()
    assert recent.folder.is_dir() and recent.lock.is_file()
    assert len(said) == 1
    assert str(old.folder.resolve()) in said[0] and "unused for 20 days" in said[0] and "max_age_days" in said[0]


def test_over_the_size_bound_the_least_recently_used_go_first(tmp_path: Path) -> None:
    a = _folder(tmp_path / "ts-shared-a", size=100_000, idle_days=3)
    b = _folder(tmp_path / "ts-shared-b", size=100_000, idle_days=1)
    c = _folder(tmp_path / "ts-shared-c", size=100_000, idle_days=2)
    said: list[str] = []
    bound = CacheBound(max_size_gb=250_000 / GB)  # room for two of the three
    removed = prune(typescript._kept(tmp_path), bound, said.append)
    assert removed == [a.folder.resolve()]
    assert b.folder.is_dir() and c.folder.is_dir()
    assert len(said) == 1 and "least recently used" in said[0] and "max_size_gb" in said[0]


def test_a_folder_a_build_holds_is_never_removed(tmp_path: Path) -> None:
    held = Kept(tmp_path / "ts-shared-held", tmp_path / "ts-shared-held.lock")
    with holding(held):
        held.folder.mkdir()
        (held.folder / "data").write_bytes(b"x" * 100_000)
        when = time.time() - 100 * DAY
        os.utime(held.lock, (when, when))  # stale by its stamp, but in use right now
        said: list[str] = []
        removed = prune(typescript._kept(tmp_path), CacheBound(max_age_days=1, max_size_gb=1 / GB), said.append)
        assert removed == [] and said == []
        assert held.folder.is_dir()


def test_taking_the_lock_stamps_the_last_use(tmp_path: Path) -> None:
    kept = _folder(tmp_path / "ts-shared-x", idle_days=30)
    with holding(kept):
        pass
    assert time.time() - kept.lock.stat().st_mtime < 60
    assert prune(typescript._kept(tmp_path), CacheBound(max_age_days=14), print) == []


def test_rust_folders_of_the_layout_before_the_key_and_stale_crate_builds_are_removed(tmp_path: Path) -> None:
    old = _folder(tmp_path / "hello-rust" / "tools", lock_inside=True)
    (old.folder / "workspace").mkdir()
    (old.folder / "target").mkdir()
    keyed = _folder(tmp_path / "shared" / "rustc-1.95.0-lock-0123456789abcdef", lock_inside=True)
    tool = _folder(tmp_path / "packages" / "some-tool-1.0", lock_inside=True)  # packaged.py's: bounded, kept
    stale_tool = _folder(tmp_path / "packages" / "some-tool-0.9", lock_inside=True, idle_days=30)
    stale_tool.lock.unlink()  # built before builds took a lock there: the folder's own time counts
    os.utime(stale_tool.folder, (time.time() - 30 * DAY, time.time() - 30 * DAY))
    (tmp_path / "sdk-test-target" / "release").mkdir(parents=True)  # the SDK tests' target, not a build's
    said: list[str] = []
    removed = rust._prune(tmp_path, CacheBound(), said.append)
    assert removed == [old.folder, stale_tool.folder] and not (tmp_path / "hello-rust").exists()
    assert keyed.folder.is_dir() and tool.folder.is_dir()
    assert (tmp_path / "sdk-test-target").is_dir()
    assert len(said) == 2 and "older cache layout" in said[0] and str(old.folder) in said[0]
    assert str(stale_tool.folder) in said[1] and "max_age_days" in said[1]


def test_a_build_waiting_for_a_lock_prune_removed_takes_the_new_one(tmp_path: Path) -> None:
    kept = Kept(tmp_path / "shared" / "key", tmp_path / "shared" / "key" / ".lock")
    kept.folder.mkdir(parents=True)
    first = open(kept.lock, "a")
    fcntl.flock(first, fcntl.LOCK_EX)
    waited = threading.Event()
    held_inode: list[int] = []

    def build() -> None:
        with holding(kept, on_wait=waited.set) as lock:
            held_inode.append(os.fstat(lock.fileno()).st_ino)

    thread = threading.Thread(target=build)
    thread.start()
    assert waited.wait(5), "the second build did not wait for the first"
    time.sleep(0.1)
    kept.lock.unlink()  # as prune does while it holds the lock
    first.close()
    thread.join(5)
    assert not thread.is_alive()
    # It held the lock file at the path (made again), not the removed one a third build would miss.
    assert kept.lock.is_file() and held_inode == [kept.lock.stat().st_ino]


@pytest.mark.parametrize(
    ("table", "said"),
    [("max_age_days = 0", "build_cache.max_age_days"), ("max_size_gb = -1", "build_cache.max_size_gb")],
)
def test_a_bound_that_bounds_nothing_is_refused(tmp_path: Path, table: str, said: str) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f"[build_cache]\n{table}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert said in str(e.value)
    path.write_text("[build_cache]\nmax_age_days = 3\nmax_size_gb = 2.5\n")
    assert load_config(path).build_cache == CacheBound(max_age_days=3, max_size_gb=2.5)
