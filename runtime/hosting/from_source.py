"""Compiled bundles served from source: built by their toolchain into the node's state folder.

One build for the node's tools bundles and `meshctl node units`' service bundles.

A build is kept with a digest of everything it was made from (the module folder and, inside
this checkout, the language's SDK); the next start with the same sources reuses it, so a node
restart does not pay for a TypeScript or Rust build again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import msgspec

from launcher.env import resolve_argv
from launcher.process import ChildSpec
from manifests import BundleManifest, LoadedModule
from runtime.hosting.confine import moved
from toolchains.build import find_repo_root, stage_bundle
from toolchains.bytecode import compile_bytecode
from toolchains.cache_bound import CacheBound
from toolchains.progress import BuildProgress

log = logging.getLogger("mesh.source")

# Build outputs and caches inside a source tree: not what a build is made from.
SKIP = frozenset({"node_modules", "target", ".git", "__pycache__", "dist", ".venv", "build", ".cache"})


class _Stamp(msgspec.Struct):
    digest: str
    env: dict[str, str]
    listing: str = ""  # names, sizes and mtimes: when they are unchanged, the contents are not read


def _files(folders: list[Path]) -> list[tuple[Path, str, os.stat_result]]:
    found = []
    for i, folder in enumerate(folders):
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in SKIP)
            for name in sorted(files):
                path = Path(root) / name
                st = path.lstat()
                if not stat.S_ISREG(st.st_mode):
                    continue  # links and special files are not what a build reads here
                found.append((path, f"{i}/{path.relative_to(folder)}", st))
    return found


def _listing(files: list[tuple[Path, str, os.stat_result]]) -> str:
    h = hashlib.sha256()
    for _, rel, st in files:
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def source_digest(folders: list[Path], files: list[tuple[Path, str, os.stat_result]] | None = None) -> str:
    h = hashlib.sha256()
    for path, rel, _ in files if files is not None else _files(folders):
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _inputs(loaded: LoadedModule, language: str) -> list[Path]:
    folders = [loaded.root]
    repo = find_repo_root(loaded.root)
    if repo is not None and (repo / "sdk" / language).is_dir():
        folders.append(repo / "sdk" / language)
    return folders


def build_dir(state_dir: Path | str, module: str, bundle: str) -> Path:
    """Where a bundle served from source is built: <state>/from-source/<module>/<bundle>."""
    return Path(state_dir).absolute() / "from-source" / module / bundle


def build_from_source(
    loaded: LoadedModule,
    spec: BundleManifest,
    state_dir: Path | str,
    progress: Callable[[str], None] = log.info,
    cache_bound: CacheBound | None = None,
) -> tuple[Path, dict[str, str]]:
    """Build (or reuse) one bundle of a module served from source: its folder and the toolchain's env.

    Blocking; the node runs it in a worker thread. Staged beside the target, then renamed into
    place, so a failed build leaves the last good one as it was.
    """
    target = build_dir(state_dir, loaded.module.name, spec.name)
    stamp_path = target.with_name(target.name + ".source.json")
    folders = _inputs(loaded, spec.language)
    files = _files(folders)
    listing = _listing(files)
    stamp: _Stamp | None = None
    if target.is_dir() and stamp_path.is_file():
        try:
            stamp = msgspec.json.decode(stamp_path.read_bytes(), type=_Stamp)
        except (msgspec.DecodeError, msgspec.ValidationError):
            stamp = None
    if stamp is not None and stamp.listing == listing:
        log.info("bundle %s/%s: built from these sources already; reusing it", loaded.module.name, spec.name)
        return target, stamp.env
    digest = source_digest(folders, files)
    if stamp is not None and stamp.digest == digest:
        stamp_path.write_bytes(msgspec.json.encode(_Stamp(digest, stamp.env, listing)))
        log.info("bundle %s/%s: built from these sources already; reusing it", loaded.module.name, spec.name)
        return target, stamp.env
    key = f"{loaded.module.name}/{spec.name}"
    log.info("bundle %s: building from source (%s)", key, spec.language)
    work = target.with_name(target.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    # Plain lines (a node's output is a log): "still building ... after N s" while the compiler is silent.
    with BuildProgress(progress, live=False) as clock:
        clock.start(key, spec.language)
        output = stage_bundle(loaded, spec, work, progress=clock, cache_bound=cache_bound)
        if spec.language == "python":  # a package bundle built from its lock: its children start faster
            compile_bytecode(work)
        clock.done(key)
    log.info("bundle %s: built from source in %.1f s", key, time.monotonic() - started)
    stamp_path.unlink(missing_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    work.rename(target)
    env = dict(output.env)
    stamp_path.write_bytes(msgspec.json.encode(_Stamp(digest, env, listing)))
    return target, env


T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread of its own that nobody waits for when the caller is cancelled.

    A stop interrupts a build at once: the compiler run finishes on its own in the background
    (into its `.building` folder) and the node's exit does not wait for it (a daemon thread).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():
            return  # the caller went away
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work() -> None:
        result, error = None, None
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the caller as it is
            error = e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the node's loop has ended: nobody is left to tell

    threading.Thread(target=work, name=f"build {getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return await done


def preparer(
    loaded: LoadedModule, spec: BundleManifest, state_dir: Path | str, child: ChildSpec, cache_bound: CacheBound
) -> Callable[[], Awaitable[ChildSpec]]:
    """A runner's `prepare`: build the bundle first, then run `child` from the build's folder."""

    async def prepare() -> ChildSpec:
        target, build_env = await in_daemon_thread(build_from_source, loaded, spec, state_dir, log.info, cache_bound)
        env = dict(child.env)
        for k, v in build_env.items():
            env[k] = v.replace("{bundle_dir}", str(target))
        env["MESH_BUNDLE_DIR"] = str(target)
        argv = resolve_argv(spec.entry, target)
        # The confinement moves with the child: the build's folder is the one it may read.
        confinement = moved(child.confinement, target, argv) if child.confinement is not None else None
        return dataclasses.replace(child, argv=argv, cwd=str(target), env=env, confinement=confinement)

    return prepare
