"""What a child is given to run with: argv resolved, and an environment built from scratch.

Nothing of the runtime's own environment reaches a child except a short allowlist and the
variables its manifest asks for by name: the node's NATS credentials and tokens stay home.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Mapping

ALLOWLIST: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class EntryNotFound(Exception):
    def __init__(self, entry: str, looked: list[str]) -> None:
        self.entry, self.looked = entry, looked
        super().__init__(f"entry {entry!r} not found (looked at: {', '.join(looked)})")


def resolve_argv(entry: list[str], bundle_dir: Path, path: str | None = None) -> list[str]:
    """entry[0] is an interpreter the node provides, a file in the bundle, or a program on PATH."""
    first, rest = entry[0], entry[1:]
    if first in ("python", "python3"):
        # Python bundles run on the node's own interpreter; their packages travel in the bundle.
        return [sys.executable, *rest]
    local = bundle_dir / first
    if "/" in first or local.exists():
        if not local.is_file():
            raise EntryNotFound(first, [str(local)])
        return [str(local), *rest]
    found = shutil.which(first, path=path or os.environ.get("PATH", DEFAULT_PATH))
    if found is None:
        raise EntryNotFound(first, [str(local), f"PATH={path or os.environ.get('PATH', '')}"])
    return [found, *rest]


def child_env(
    *,
    node: str,
    module: str,
    bundle: str,
    bundle_dir: Path,
    data_dir: Path,
    manifest_env: Mapping[str, str],
    pass_env: list[str],
    build_env: Mapping[str, str] | None = None,
    child_user: str | None = None,
    parent: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The child's whole environment; a child run as `child_user` gets that user's HOME and names."""
    parent = os.environ if parent is None else parent
    env = {k: parent[k] for k in ALLOWLIST if k in parent}
    env.setdefault("PATH", DEFAULT_PATH)
    for name in pass_env:
        if name in parent:
            env[name] = parent[name]
    placeholder = str(bundle_dir)
    for k, v in (build_env or {}).items():
        env[k] = v.replace("{bundle_dir}", placeholder)
    env.update(manifest_env)
    env.update(secrets or {})  # after the manifest's env: a manifest cannot shadow the node's secret
    env.update(
        {
            "MESH_NODE": node,
            "MESH_MODULE": module,
            "MESH_BUNDLE": bundle,
            "MESH_BUNDLE_DIR": str(bundle_dir),
            "MESH_DATA_DIR": str(data_dir),
            # Children answer on a pipe; a Python child must not hold its replies in a buffer.
            "PYTHONUNBUFFERED": "1",
        }
    )
    if child_user:
        pw = pwd.getpwnam(child_user)
        env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
    return env
