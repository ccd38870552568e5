"""Import from crates.io: the crate's published source and Cargo.lock, its binary from Cargo.toml.

`cargo info` fetches the `.crate` into cargo's own cache (its sha256 is crates.io's checksum);
the crate's published Cargo.lock pins every dependency with its checksum, and `cargo fetch
--locked` brings them into cargo's cache so the build (`cargo install --locked`) can run offline.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
import tomllib
from pathlib import Path
from typing import Any

from manifests.imported import Fetched, PackageLock
from runtime.meshctl.imports.fetch import Fetch, Resolved
from toolchains.packaged import cargo_env, cargo_home


def resolve(fetch: Fetch, args: list[str]) -> Resolved:
    spec, env = fetch.spec, cargo_env(fetch.offline)
    query = f"{spec.package}@{spec.version}" if spec.version else spec.package
    shown = fetch.run(["cargo", "info", query, "--color", "never"], fetch.work, env)
    found = re.search(r"^version: (\S+)", shown, re.M)
    if found is None:
        raise fetch.fail(f"cargo info named no version ({shown.strip()[:200]})")
    version = found.group(1)
    if spec.version and version != spec.version:
        raise fetch.fail(f"crates.io has no version {spec.version} of {spec.package} (cargo info found {version})")
    crate = _crate_file(fetch, spec.package, version)
    source = fetch.work / "crate"
    with tarfile.open(crate) as tar:
        tar.extractall(source, filter="data")
    root = source / f"{spec.package}-{version}"
    manifest = _toml(fetch, root / "Cargo.toml")
    binary = _binary(fetch, root, manifest)
    if not (root / "Cargo.lock").is_file():
        raise fetch.fail(f"{spec.package} {version} was published without a Cargo.lock: its build could not be pinned")
    fetch.log(f"cargo: fetching the {spec.package} {version} dependencies its Cargo.lock pins")
    # From outside the crate: a rust-toolchain.toml in it would make rustup fetch another Rust.
    fetch.run(["cargo", "fetch", "--locked", "--manifest-path", str(root / "Cargo.toml")], fetch.work, env)
    fetched = [Fetched(name=spec.package, version=version, hash=f"sha256:{_sha256(crate)}", file=crate.name)]
    for package in _toml(fetch, root / "Cargo.lock").get("package", []):
        if package.get("source", "").startswith("registry+") and package.get("checksum"):
            fetched.append(
                Fetched(name=package["name"], version=package["version"], hash=f"sha256:{package['checksum']}")
            )
    lock = PackageLock(
        registry="cargo",
        package=spec.package,
        version=version,
        spec=spec.pinned(version),
        entry=[f"bin/{binary}", *args],
        fetched=sorted(fetched, key=lambda f: (f.name, f.version)),
    )
    description = manifest.get("package", {}).get("description", "")
    return Resolved(lock, {}, description if isinstance(description, str) else "")


def _crate_file(fetch: Fetch, name: str, version: str) -> Path:
    for cache in sorted((cargo_home() / "registry" / "cache").glob("*")):
        path = cache / f"{name}-{version}.crate"
        if path.is_file():
            return path
    raise fetch.fail(f"cargo info did not leave {name}-{version}.crate in {cargo_home() / 'registry' / 'cache'}")


def _toml(fetch: Fetch, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise fetch.fail(f"{path.name} of the crate cannot be read: {e}") from None


def _binary(fetch: Fetch, root: Path, manifest: dict[str, Any]) -> str:
    """The crate's binary: the only [[bin]], the one named like the crate, or src/main.rs's."""
    name = fetch.spec.package
    bins = [b["name"] for b in manifest.get("bin", []) if isinstance(b, dict) and isinstance(b.get("name"), str)]
    if (root / "src" / "main.rs").is_file() and name not in bins:
        bins.append(name)
    if len(bins) == 1:
        return bins[0]
    if name in bins:
        return name
    if not bins:
        raise fetch.fail("the crate has no binary target: it is a library, not a server one can run")
    raise fetch.fail(f"the crate has several binaries ({', '.join(sorted(bins))}); write the entry by hand")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
