"""Delivery as an attacker does it: artifacts written by hand (any bundle.json, any size), put
straight into the object store, and membership values written straight into KV, bypassing every
check `meshctl bundle deliver` makes.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from runtime.wire.membership import buckets, node_key
from tests.support.mesh import RAW_CHILD, status
from toolchains.artifact import sha256_file

MB = 1024 * 1024


def manifest_text(module: str, version: str, *, extra: str = "") -> str:
    return (
        f'name = "{module}"\nversion = "{version}"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        f'language = "python"\nsource = "src"\nentry = ["python", "raw_child.py"]\n'
        f'env = {{ RAW_VERSION = "{version}" }}\n{extra}'
    )


class _Zeros(io.RawIOBase):
    """`size` zero bytes, read in pieces: a huge member without holding it in memory."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def _digest(content: bytes | int) -> str:
    if isinstance(content, bytes):
        return hashlib.sha256(content).hexdigest()
    h, left, block = hashlib.sha256(), content, bytes(MB)
    while left:
        h.update(block[: min(left, MB)])
        left -= min(left, MB)
    return h.hexdigest()


def write_artifact(
    path: Path,
    module: str,
    version: str,
    *,
    members: dict[str, bytes | int] | None = None,
    manifest: str | None = None,
    meta_extra: dict[str, Any] | None = None,
    level: int = 6,
) -> Path:
    """A .tar.gz artifact of the raw test child, plus `members` (bytes, or a count of zero bytes).

    Every member is listed in bundle.json with its true sha256, so only the node's limits and
    rules can refuse it."""
    files: dict[str, bytes | int] = {"raw_child.py": RAW_CHILD.read_bytes(), **(members or {})}
    meta: dict[str, Any] = {
        "format": 1,
        "module": module,
        "bundle": "tools",
        "version": version,
        "kind": "tools",
        "language": "python",
        "entry": ["python", "raw_child.py"],
        "env": {},
        "files": {name: _digest(content) for name, content in files.items()},
        "links": {},
        "exec": [],
        "manifest": manifest if manifest is not None else manifest_text(module, version),
        **(meta_extra or {}),
    }
    meta_bytes = json.dumps(meta, sort_keys=True).encode() + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0) as gz,
    ):
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, content in [("bundle.json", meta_bytes), *sorted(files.items())]:
                info = tarfile.TarInfo(name)
                info.mode = 0o644
                info.size = len(content) if isinstance(content, bytes) else content
                tar.addfile(info, io.BytesIO(content) if isinstance(content, bytes) else _Zeros(content))
    return path


async def upload(nc: Client, path: Path, object_name: str | None = None) -> dict[str, str]:
    """Put an artifact into the object store as deliver names it; its membership ArtifactRef as a dict."""
    obs, _ = await buckets(nc)
    digest = sha256_file(path)
    meta = json.loads(_first_member(path))
    name = object_name or f"{meta['module']}/{meta['bundle']}/{meta['version']}/{digest[:16]}.tar.gz"
    with open(path, "rb") as f:
        await obs.put(name, f)  # type: ignore[attr-defined]
    return {"object": name, "sha256": digest, "language": "python", "kind": "tools"}


def _first_member(path: Path) -> bytes:
    with tarfile.open(path, mode="r|gz") as tar:
        first = tar.next()
        assert first is not None
        f = tar.extractfile(first)
        assert f is not None
        return f.read()


async def put_membership(nc: Client, node: str, modules: dict[str, Any]) -> None:
    """Write a node's membership value as given: no check, no revision (an attacker's write)."""
    _, kv = await buckets(nc)
    await kv.put(node_key(node), json.dumps({"modules": modules}).encode())  # type: ignore[attr-defined]


def module_ref(version: str, bundles: dict[str, dict[str, str]], seats: list[str] | None = None) -> dict[str, Any]:
    return {"version": version, "seats": seats or [], "bundles": bundles}


async def wait_problem(nc: Client, node: str, *words: str, timeout: float = 20) -> str:
    """The first status problem holding every word; fail naming the problems seen."""
    deadline = time.monotonic() + timeout
    problems: list[str] = []
    while time.monotonic() < deadline:
        problems = (await status(nc, node))["problems"]
        for p in problems:
            if all(w in p for w in words):
                return p
        await asyncio.sleep(0.1)
    raise AssertionError(f"no status problem with {words} within {timeout} s; problems: {problems}")


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, MB, from /proc."""
    text = Path(f"/proc/{pid}/status").read_text()
    kb = {k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.*)$", text, re.M)}
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def error_lines(log: str, *words: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line and all(w in line for w in words)]


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
