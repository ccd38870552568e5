"""Import from the Go module proxy: the module holding the main package, and what it builds with."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from manifests.imported import Fetched, PackageLock
from runtime.meshctl.imports.fetch import Fetch, Resolved
from toolchains.packaged import go_env


def resolve(fetch: Fetch, args: list[str]) -> Resolved:
    spec = fetch.spec
    env = go_env(fetch.offline)
    query = spec.version or "latest"
    module, info = _find_module(fetch, spec.package, query, env)
    version = str(info["Version"])
    subdir = spec.package[len(module) :].lstrip("/")
    folder = Path(str(info["Dir"])) / subdir
    if not _is_main(folder):
        raise fetch.fail(f"{spec.package} is not a main package (no `package main` in {subdir or 'the module root'})")
    fetch.log(f"go: {spec.package} is in module {module}@{version}; listing what it builds with")
    # Inside the fetched module, the modules its build needs (fetched into the module cache now,
    # so the build can run offline) with their go.sum hashes.
    listing = fetch.run(
        [
            "go",
            "list",
            "-deps",
            "-f",
            "{{with .Module}}{{.Path}} {{.Version}}{{end}}",
            "./" + subdir if subdir else ".",
        ],
        Path(str(info["Dir"])),
        dict(env, GOFLAGS="-mod=readonly"),
    )
    sums = _go_sum(Path(str(info["Dir"])) / "go.sum")
    fetched = [Fetched(name=module, version=version, hash=str(info["Sum"]))]
    for line in sorted(set(listing.split("\n"))):
        dep, _, dep_version = line.partition(" ")
        if not dep or dep == module:
            continue
        digest = sums.get((dep, dep_version))
        if digest is None:
            raise fetch.fail(f"{module}'s go.sum has no hash for {dep} {dep_version}")
        fetched.append(Fetched(name=dep, version=dep_version, hash=digest))
    binary = spec.package.rsplit("/", 1)[-1]
    lock = PackageLock(
        registry="go",
        package=spec.package,
        version=version,
        spec=spec.pinned(version),
        entry=[f"bin/{binary}", *args],
        fetched=sorted(fetched, key=lambda f: f.name),
        module=module,
    )
    return Resolved(lock, {}, f"{spec.package} (Go, {module}@{version})")


def _find_module(fetch: Fetch, package: str, query: str, env: dict[str, str]) -> tuple[str, dict[str, object]]:
    """The longest prefix of `package` that is a module at `query`, as `go get` finds it."""
    parts = package.split("/")
    errors = []
    for n in range(len(parts), 1, -1):
        candidate = "/".join(parts[:n])
        proc = _download(candidate, query, fetch.work, env)
        if proc.get("Error") is None and proc.get("Dir"):
            return candidate, proc
        errors.append(f"{candidate}@{query}: {proc.get('Error') or 'no module'}")
    raise fetch.fail("no module on the Go module proxy holds it:\n  " + "\n  ".join(errors[-3:]))


def _download(module: str, query: str, cwd: Path, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{query}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    try:
        found = json.loads(proc.stdout)
    except ValueError:
        return {"Error": (proc.stderr.strip().splitlines() or ["go mod download failed"])[-1]}
    return found if isinstance(found, dict) else {"Error": "go mod download said nothing"}


def _is_main(folder: Path) -> bool:
    for path in folder.glob("*.go"):
        if path.name.endswith("_test.go"):
            continue
        if re.search(r"^package main\b", path.read_text("utf-8", "replace"), re.M):
            return True
    return False


def _go_sum(path: Path) -> dict[tuple[str, str], str]:
    sums: dict[tuple[str, str], str] = {}
    try:
        lines = path.read_text("utf-8").splitlines()
    except OSError:
        return sums
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and not fields[1].endswith("/go.mod"):
            sums[(fields[0], fields[1])] = fields[2]
    return sums
