"""The sandbox's exec helper, `mesh-sandbox` (launcher/sandbox_exec.c): built once per source and
flags, on first use or by setup, into a cache a `child_user` can reach; or given prebuilt."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("sandbox_exec.c")
HELPER_NAME = "mesh-sandbox"
COMPILER = "gcc"
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-fstack-protector-strong")
HELPER_ENV = "MESH_SANDBOX_HELPER"  # a prebuilt helper (packagers, tests)
CACHE_ENV = "MESH_SANDBOX_CACHE"  # where the helper is built; default below


@functools.cache
def helper() -> tuple[str | None, str]:
    """The helper's path, built on first use; or None and why it cannot be had."""
    given = os.environ.get(HELPER_ENV)
    if given:
        if os.access(given, os.X_OK):
            return given, ""
        return None, f"{HELPER_ENV}={given} is not an executable file"
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / digest / HELPER_NAME
    if os.access(target, os.X_OK):
        return str(target), ""
    try:
        build(target)
    except BuildFailed as e:
        return None, str(e)
    return str(target), ""


def cache_dir() -> Path:
    """Where the helper is built. A root node's lives outside /root: a child run as another
    user (`child_user`) execs it after giving up root, and must be able to reach it."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.geteuid() == 0:
        return Path("/var/cache/mesh-node/sandbox")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mesh-node" / "sandbox"


class BuildFailed(Exception):
    pass


def build(target: Path) -> None:
    """Compile the helper to `target` (atomically: a half-written helper is never run)."""
    compiler = shutil.which(COMPILER)
    if compiler is None:
        raise BuildFailed(f"no C compiler ({COMPILER}) to build the sandbox helper; apt-get install gcc")
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as e:
        raise BuildFailed(f"cannot make {target.parent} for the sandbox helper: {e.strerror}") from None
    fd, scratch = tempfile.mkstemp(prefix=".build-", dir=target.parent)
    os.close(fd)
    try:
        for link in (["-static"], []):  # static where libc.a is installed, else dynamic
            done = subprocess.run(
                [compiler, *CFLAGS, *link, "-o", scratch, str(SOURCE)], capture_output=True, text=True, timeout=120
            )
            if done.returncode == 0:
                break
        else:
            raise BuildFailed(f"the sandbox helper does not compile: {done.stderr.strip()[-2000:]}")
        os.chmod(scratch, 0o755)
        os.replace(scratch, target)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildFailed(f"cannot build the sandbox helper: {e}") from None
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
