"""Write the module folder of an imported package; run the registries' clients with clear errors.

The folder is written only when everything was fetched and found: into a scratch folder beside
the target, renamed into place at the end, so a failed import (a version that does not exist, no
network, no entry in the package) leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from manifests.imported import LANGUAGE_OF, REGISTRIES, PackageLock, encode_lock, lock_path
from manifests.model import NAME_RE
from runtime.meshctl.errors import Refused
from runtime.meshctl.imports.spec import ImportSpec, parse_spec
from toolchains.packaged import package_cache_dir  # the build reads the same cache

CLIENT_TIMEOUT_S = 900  # a cold cache on a slow link
OUTPUT_TAIL_LINES = 12
SOURCE = "package"  # the bundle's source folder inside the module


class ImportFailed(Refused):
    def __init__(self, spec: str, reason: str) -> None:
        self.spec, self.reason = spec, reason
        super().__init__(f"import of {spec} failed: {reason}; nothing was written")


@dataclass
class Resolved:
    """What a registry's importer found: the lock, and the registry's own files for the source folder."""

    lock: PackageLock
    files: dict[str, bytes] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class Fetch:
    """How an importer may reach its registry."""

    spec: ImportSpec
    text: str  # the spec as the user wrote it, for errors
    cache: Path  # the package cache (toolchains.packaged.package_cache_dir)
    offline: bool
    work: Path  # a scratch folder, removed afterwards
    log: Callable[[str], None]

    def fail(self, reason: str) -> ImportFailed:
        return ImportFailed(self.text, reason)

    def run(self, command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
        """Run a registry client; its stdout, or ImportFailed with the tail of what it said."""
        try:
            proc = subprocess.run(
                command,
                cwd=cwd,
                env=env if env is not None else dict(os.environ),
                capture_output=True,
                text=True,
                timeout=CLIENT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise self.fail(
                f"`{command[0]}` is not installed; importing from {REGISTRIES[self.spec.registry]} needs it"
            ) from None
        except subprocess.TimeoutExpired:
            raise self.fail(f"`{' '.join(command[:3])}` did not finish in {CLIENT_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            said = [
                line
                for line in (proc.stderr + proc.stdout).strip().splitlines()
                if line.strip() and "A complete log of this run" not in line  # npm's pointer to its own log
            ]
            tail = "\n  ".join(said[-OUTPUT_TAIL_LINES:]) or f"exit code {proc.returncode}"
            hint = " (offline: is the package in the cache? run without --offline once)" if self.offline else ""
            raise self.fail(f"`{' '.join(command[:3])}` refused it{hint}:\n  {tail}")
        return proc.stdout


def default_name(spec: ImportSpec) -> str:
    """A module name from the package's: its last part, lower case, [a-z0-9-] only."""
    last = spec.package.rsplit("/", 1)[-1].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", last).strip("-")
    if not name or not name[0].isalpha():
        name = "mcp-" + name
    return name[:63].rstrip("-")


def import_package(
    text: str,
    *,
    name: str | None = None,
    out: Path | None = None,
    args: list[str] | None = None,
    cache: Path | None = None,
    offline: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Fetch the package of `text` (a SPEC) and write its module folder; return the folder."""
    from runtime.meshctl.imports import cargo, gomod, npm, pypi

    spec = parse_spec(text)
    module_name = name or default_name(spec)
    if not NAME_RE.match(module_name):
        raise ImportFailed(text, f"{module_name!r} is not a module name ([a-z][a-z0-9-]{{0,62}}); give one with --name")
    target = Path(out) if out is not None else Path.cwd() / module_name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ImportFailed(text, f"{target} exists and is not empty; choose another folder with --out")
    importers = {"npm": npm.resolve, "pypi": pypi.resolve, "go": gomod.resolve, "cargo": cargo.resolve}
    cache_dir = (cache if cache is not None else package_cache_dir()).absolute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mesh-import-") as work:
        fetch = Fetch(spec, text, cache_dir, offline, Path(work), log)
        resolved = importers[spec.registry](fetch, list(args or []))
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.importing-", dir=target.parent))
    try:
        (scratch / SOURCE).mkdir()
        for rel, data in sorted(resolved.files.items()):
            (scratch / SOURCE / rel).write_bytes(data)
        lock_path(scratch / SOURCE).write_bytes(encode_lock(resolved.lock))
        (scratch / "module.toml").write_text(_manifest(module_name, resolved), "utf-8")
        if target.exists():
            target.rmdir()  # empty, checked above
        scratch.rename(target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def _toml(value: object) -> str:
    # JSON strings and arrays of strings are valid TOML basic strings and arrays.
    return json.dumps(value, ensure_ascii=False)


def _manifest(name: str, resolved: Resolved) -> str:
    lock = resolved.lock
    lines = [
        f"# Imported by `meshctl module import {lock.spec}`: third-party code from {REGISTRIES[lock.registry]},",
        f"# pinned with hashes in {SOURCE}/mesh-import.json. Not this module's own code.",
        f"name = {_toml(name)}",
        f"version = {_toml(lock.version.removeprefix('v'))}",
    ]
    if resolved.description:
        lines.append(f"description = {_toml(resolved.description[:300])}")
    lines += [
        "",
        "[[bundle]]",
        'name = "tools"',
        'kind = "tools"',
        f"language = {_toml(LANGUAGE_OF[lock.registry])}",
        f"source = {_toml(SOURCE)}",
        f"entry = {_toml(lock.entry)}",
        "# Secrets (API keys) the server reads: name them here; their values come from the node's",
        "# environment or its secrets file, never from this file.",
        "# pass_env = []",
        "",
        "[[artifact]]",
        'kind = "package"',
        f"ref = {_toml(lock.spec)}",
        "",
    ]
    return "\n".join(lines)
