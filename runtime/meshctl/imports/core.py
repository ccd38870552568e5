"""Write the module folder of an imported package; run the registries' clients with clear errors.

The folder is written only when everything was fetched and found: into a scratch folder beside
the target, renamed into place at the end, so a failed import (a version that does not exist, no
network, no entry in the package) leaves nothing behind.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from manifests.imported import LANGUAGE_OF, REGISTRIES, encode_lock, lock_path
from manifests.model import MAX_SANDBOX_ENTRIES, NAME_RE, parse_endpoint
from runtime.meshctl.imports.cargo import resolve as cargo_resolve
from runtime.meshctl.imports.fetch import Fetch, ImportFailed, Resolved
from runtime.meshctl.imports.gomod import resolve as go_resolve
from runtime.meshctl.imports.npm import resolve as npm_resolve
from runtime.meshctl.imports.pypi import resolve as pypi_resolve
from runtime.meshctl.imports.spec import ImportSpec, parse_spec
from toolchains.packaged import package_cache_dir  # the build reads the same cache

SOURCE = "package"  # the bundle's source folder inside the module


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
    allow_net: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Fetch the package of `text` (a SPEC) and write its module folder; return the folder.

    `allow_net`: the TCP destinations ("HOST:PORT") the server may connect to, written into the
    manifest's `network`; none: it runs with no network at all (docs/internals.md, "Confinement").
    """
    spec = parse_spec(text)
    network = checked_network(text, allow_net or [])
    module_name = name or default_name(spec)
    if not NAME_RE.match(module_name):
        raise ImportFailed(text, f"{module_name!r} is not a module name ([a-z][a-z0-9-]{{0,62}}); give one with --name")
    target = Path(out) if out is not None else Path.cwd() / module_name
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ImportFailed(text, f"{target} exists and is not empty; choose another folder with --out")
    importers = {"npm": npm_resolve, "pypi": pypi_resolve, "go": go_resolve, "cargo": cargo_resolve}
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
        (scratch / "module.toml").write_text(_manifest(module_name, resolved, network), "utf-8")
        if target.exists():
            target.rmdir()  # empty, checked above
        scratch.rename(target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return target


def checked_network(text: str, allow_net: list[str]) -> list[str]:
    """`--allow-net` values, each checked as the manifest's `network` is (before anything is fetched)."""
    if len(allow_net) > MAX_SANDBOX_ENTRIES:
        raise ImportFailed(text, f"--allow-net is given {len(allow_net)} times; at most {MAX_SANDBOX_ENTRIES}")
    for entry in allow_net:
        try:
            parse_endpoint(entry)
        except ValueError as e:
            raise ImportFailed(text, f"--allow-net {entry!r}: {e}") from None
    return list(dict.fromkeys(allow_net))


def _toml(value: object) -> str:
    # JSON strings and arrays of strings are valid TOML basic strings and arrays.
    return json.dumps(value, ensure_ascii=False)


def _manifest(name: str, resolved: Resolved, network: list[str]) -> str:
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
        "# The TCP destinations it may connect to (`meshctl module import --allow-net HOST:PORT`);",
        "# none: no network at all. Enforced by the kernel, as every bundle's sandbox is.",
        f"network = {_toml(network)}",
        "",
        "[[artifact]]",
        'kind = "package"',
        f"ref = {_toml(lock.spec)}",
        "",
    ]
    return "\n".join(lines)
