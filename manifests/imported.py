"""The lock of an imported package: what `meshctl module import` fetched, pinned by hash.

A bundle whose source folder holds `mesh-import.json` is a package bundle: third-party code
from a registry (npm, PyPI, crates.io, the Go module proxy), not the module's own. The
toolchains build it from this lock (and the registry's own lock files beside it), the
registration check names it as third-party. Read-only here: nothing in `manifests/` fetches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

LOCK_NAME = "mesh-import.json"
LOCK_FORMAT = 1

Registry = Literal["npm", "pypi", "cargo", "go"]
REGISTRIES: dict[str, str] = {
    "npm": "the npm registry",
    "pypi": "PyPI",
    "cargo": "crates.io",
    "go": "the Go module proxy",
}
LANGUAGE_OF: dict[str, str] = {"npm": "typescript", "pypi": "python", "cargo": "rust", "go": "go"}


class Fetched(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, omit_defaults=True):
    """One file or module fetched from the registry, as the registry's client identified it."""

    name: str
    version: str
    hash: str  # "sha512-<base64>" (npm), "sha256:<hex>" (wheels, crates), "h1:<base64>" (Go)
    file: str = ""  # the file's name where the registry serves files (a wheel, a .crate)


class PackageLock(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    format: int = LOCK_FORMAT
    registry: Registry
    package: str  # the name as the registry knows it: "@scope/name", "mcp-server-time", a Go package path
    version: str
    spec: str  # "npm:@scope/name@1.2.3", exactly reproducible
    entry: list[str]  # argv in the built bundle, ARGS included
    fetched: list[Fetched]  # every file the import fetched, sorted by name
    # Go: the module that holds `package` (a package path may sit inside a larger module).
    module: str = ""
    # Python: the CPython ABI the wheels need ("cp311"), or "" when every wheel is pure Python.
    python_abi: str = ""


class LockError(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def lock_path(source_dir: Path) -> Path:
    return source_dir / LOCK_NAME


def is_package_bundle(source_dir: Path) -> bool:
    return lock_path(source_dir).is_file()


def read_lock(source_dir: Path) -> PackageLock:
    path = lock_path(source_dir)
    try:
        return msgspec.json.decode(path.read_bytes(), type=PackageLock)
    except OSError as e:
        raise LockError(path, f"cannot read the import lock: {e.strerror or e}") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise LockError(path, f"not an import lock ({e}); write it again with `meshctl module import <spec>`") from None


def encode_lock(lock: PackageLock) -> bytes:
    """Stable bytes: two imports of one spec write the same file."""
    return msgspec.json.format(msgspec.json.encode(lock), indent=2) + b"\n"
