"""Import from the npm registry: `npm install` of the one package, its lock and its `bin`."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from manifests.imported import Fetched, PackageLock
from runtime.meshctl.imports.fetch import Fetch, Resolved
from toolchains.packaged import npm_env

# The one package.json of the import's own folder: a private package that depends on the server.
ROOT_NAME = "mesh-imported"


def resolve(fetch: Fetch, args: list[str]) -> Resolved:
    spec, env = fetch.spec, npm_env(fetch.cache)
    mode = "--offline" if fetch.offline else "--prefer-offline"
    version = spec.version
    if version is None:
        shown = fetch.run(["npm", "view", spec.package, "version", "--json", mode], fetch.work, env)
        version = json.loads(shown)
        if not isinstance(version, str):
            raise fetch.fail(f"npm view gave no single newest version ({shown.strip()[:200]})")
        fetch.log(f"npm: newest {spec.package} is {version}")
    root = fetch.work / "package"
    root.mkdir()
    manifest = {"name": ROOT_NAME, "version": "0.0.0", "private": True, "dependencies": {spec.package: version}}
    (root / "package.json").write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
    fetch.log(f"npm: installing {spec.package}@{version} (install scripts off)")
    fetch.run(["npm", "install", "--ignore-scripts", "--omit=dev", "--no-audit", "--no-fund", mode], root, env)
    installed = root / "node_modules" / spec.package / "package.json"
    try:
        meta: dict[str, Any] = json.loads(installed.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise fetch.fail(f"npm installed no readable {installed.relative_to(root)}: {e}") from None
    script = _bin(fetch, meta)
    entry = ["node", str(PurePosixPath("node_modules") / spec.package / script), *args]
    lock_text = (root / "package-lock.json").read_text("utf-8")
    lock = PackageLock(
        registry="npm",
        package=spec.package,
        version=version,
        spec=spec.pinned(version),
        entry=entry,
        fetched=_fetched(fetch, json.loads(lock_text)),
    )
    files = {"package.json": (root / "package.json").read_bytes(), "package-lock.json": lock_text.encode()}
    description = meta.get("description") if isinstance(meta.get("description"), str) else ""
    return Resolved(lock, files, description or "")


def _bin(fetch: Fetch, meta: dict[str, Any]) -> str:
    """The script of the package's `bin`: the only one, or the one named like the package."""
    name = fetch.spec.package.rsplit("/", 1)[-1]
    found = meta.get("bin")
    if isinstance(found, str):
        script = found
    elif isinstance(found, dict) and found:
        if len(found) == 1:
            script = next(iter(found.values()))
        else:
            picks = [found[k] for k in (name, f"mcp-{name}", name.removeprefix("server-")) if k in found]
            if not picks:
                raise fetch.fail(
                    f"its package.json names several commands in `bin` ({', '.join(sorted(found))}); "
                    "none is named like the package: write the module's entry by hand"
                )
            script = picks[0]
    else:
        raise fetch.fail("its package.json has no `bin`: it is a library, not a server one can run")
    path = PurePosixPath(str(script))
    if path.is_absolute() or ".." in path.parts:
        raise fetch.fail(f"its `bin` {script!r} points outside the package")
    return str(path)


def _fetched(fetch: Fetch, lock: dict[str, Any]) -> list[Fetched]:
    out = []
    for where, entry in (lock.get("packages") or {}).items():
        if not where or not isinstance(entry, dict) or entry.get("link"):
            continue  # the import's own root, or a link to a local folder (none from a registry)
        integrity = entry.get("integrity")
        if not isinstance(integrity, str):
            raise fetch.fail(f"package-lock.json gives no integrity hash for {where}; refusing an unpinned package")
        name = where.rsplit("node_modules/", 1)[-1]
        resolved = str(entry.get("resolved") or "")
        out.append(
            Fetched(name=name, version=str(entry.get("version")), hash=integrity, file=resolved.rsplit("/", 1)[-1])
        )
    return sorted(out, key=lambda f: (f.name, f.version))
