"""Package bundles: a published server (`meshctl module import`) built from its import lock.

The bundle's source folder holds `mesh-import.json` and the registry's own lock files; nothing
of the module's own is compiled. Each registry's build is its ordinary client, run from the
package cache that the import filled (offline with MESH_OFFLINE=1):
- npm: `npm ci --omit=dev` from package-lock.json (integrity-checked); the stage is the
  package's production node_modules as installed, no esbuild;
- PyPI: `pip install --require-hashes --no-deps` of the locked wheels into `_vendor/`;
  `python_abi` names the interpreter ABI a compiled wheel needs;
- Go: `go install <package>@<version>` into `bin/`, static, as reproducible as a Go bundle;
- crates.io: `cargo install --locked <crate>@<version>` (the crate's published Cargo.lock) into
  `bin/`, with the Rust toolchain's reproducibility flags.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from manifests import BundleManifest
from manifests.imported import PackageLock, is_package_bundle, read_lock

from .base import BuildContext, BuildFailed, BuildOutput, default_cache_dir, run_tool
from .cache_bound import Kept, holding
from .python import VENDOR, _normalise_vendor, _platform_if_native
from .rust import ARCHES, JOBS, TOOLCHAIN, _build_env, _prune

BUILD_TIMEOUT_S = 900
LOCKS = {"npm": ("package.json", "package-lock.json"), "pypi": ("requirements.txt",), "go": (), "cargo": ()}


def package_cache_dir() -> Path:
    """Where imports fetch to and package builds read from: MESH_PACKAGE_CACHE, else beside the toolchains' cache."""
    if os.environ.get("MESH_PACKAGE_CACHE"):
        return Path(os.environ["MESH_PACKAGE_CACHE"])

    return default_cache_dir() / "packages"


def offline() -> bool:
    return os.environ.get("MESH_OFFLINE", "") not in ("", "0")


# --- each registry client's environment, shared by `meshctl module import` and the build ------
def npm_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        npm_config_cache=str(cache / "npm"),
        npm_config_update_notifier="false",
        npm_config_fund="false",
        npm_config_audit="false",
        npm_config_loglevel="error",
    )
    return env


def go_env(offline: bool) -> dict[str, str]:
    env = dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="0", GOTOOLCHAIN="local")
    if offline:
        # The module cache serves as the proxy (GOPROXY=off would refuse even the deprecation
        # look-up `go install pkg@version` makes). Hashes are still checked: the main module's
        # against the import lock, every other against the main module's go.sum.
        cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
        env.update(GOPROXY=f"file://{cache}/cache/download", GOSUMDB="off")
    return env


def cargo_home() -> Path:
    return Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")


def cargo_env(offline: bool) -> dict[str, str]:
    env = dict(os.environ, CARGO_TERM_PROGRESS_WHEN="never", CARGO_TERM_COLOR="never")
    if offline:
        env["CARGO_NET_OFFLINE"] = "true"
    return env


def runs_from_node_modules(bundle: BundleManifest, source_dir: Path) -> bool:
    """A JavaScript package used as it was published: the entry runs a script inside node_modules.

    Such a bundle (made by hand with `npm install`, or imported) needs no compiler: it is
    packed with its production node_modules from its package-lock.json, no esbuild.
    """
    entry = bundle.entry
    return (
        bundle.language == "typescript"
        and len(entry) > 1
        and entry[0] == "node"
        and entry[1].startswith("node_modules/")
        and (source_dir / "package-lock.json").is_file()
    )


def is_packaged(bundle: BundleManifest, source_dir: Path) -> bool:
    return is_package_bundle(source_dir) or runs_from_node_modules(bundle, source_dir)


def build_package(ctx: BuildContext) -> BuildOutput:
    if not is_package_bundle(ctx.source_dir):  # a JavaScript package installed by hand
        ctx.log("the entry runs a script in node_modules: packed with its production node_modules, no esbuild")
        return _npm(ctx)
    lock = read_lock(ctx.source_dir)
    for name in LOCKS[lock.registry]:
        if not (ctx.source_dir / name).is_file():
            raise BuildFailed(
                ctx.bundle.language,
                ctx.bundle.name,
                ["build"],
                f"{ctx.source_dir / name} is missing; import the package again with `meshctl module import {lock.spec}`",
            )
    ctx.log(f"package bundle: {lock.spec} ({len(lock.fetched)} locked files){' offline' if offline() else ''}")
    if lock.registry == "npm":
        return _npm(ctx)
    builders = {"pypi": _pypi, "go": _go, "cargo": _cargo}
    return builders[lock.registry](ctx, lock)


def _run(ctx: BuildContext, command: list[str], cwd: Path, env: dict[str, str]) -> str:
    language = ctx.bundle.language
    return run_tool(
        language, ctx.bundle.name, command, cwd=cwd, env=env, timeout_s=BUILD_TIMEOUT_S, install=f"install {command[0]}"
    )


def _npm(ctx: BuildContext) -> BuildOutput:
    env = npm_env(package_cache_dir())
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ctx.cache_dir, prefix="npm-package-") as scratch_name:
        scratch = Path(scratch_name)
        for name in LOCKS["npm"]:
            shutil.copyfile(ctx.source_dir / name, scratch / name)
        mode = "--offline" if offline() else "--prefer-offline"
        ctx.log(f"npm ci --omit=dev ({mode}, install scripts off)")
        _run(ctx, ["npm", "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", mode], scratch, env)
        for name in LOCKS["npm"]:
            shutil.copyfile(scratch / name, ctx.stage_dir / name)
        # npm's hidden lock repeats package-lock.json; the bundle carries that one already.
        (scratch / "node_modules" / ".package-lock.json").unlink(missing_ok=True)
        shutil.copytree(scratch / "node_modules", ctx.stage_dir / "node_modules", symlinks=True)
    return BuildOutput()


def _pypi(ctx: BuildContext, lock: PackageLock) -> BuildOutput:
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if lock.python_abi and lock.python_abi != here:
        raise BuildFailed(
            "python",
            ctx.bundle.name,
            ["pip", "install"],
            f"the locked wheels are compiled for {lock.python_abi}; this builder's Python is {here}: "
            f"build with Python {lock.python_abi[2]}.{lock.python_abi[3:]} or import the package again with this one",
        )
    wheels = package_cache_dir() / "wheels"
    have_all = all((wheels / f.file).is_file() for f in lock.fetched)
    vendor = ctx.stage_dir.resolve() / VENDOR
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",  # the lock is the whole closure, resolved at import
        "--require-hashes",
        "--only-binary=:all:",
        "--no-compile",
        "--no-warn-script-location",
        "--disable-pip-version-check",
        "--target",
        str(vendor),
        "--find-links",
        str(wheels),
        *(["--no-index"] if offline() or have_all else []),
        "--requirement",
        str(ctx.source_dir.resolve() / "requirements.txt"),
    ]
    ctx.log(f"pip install of {len(lock.fetched)} locked wheels into {VENDOR}/")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", SOURCE_DATE_EPOCH="315532800", PIP_NO_INPUT="1")
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    _run(ctx, command, ctx.cache_dir, env)
    _normalise_vendor(vendor)
    out_os, arch = _platform_if_native(vendor)
    return BuildOutput(
        env={"PYTHONPATH": "{bundle_dir}/" + VENDOR}, os=out_os, arch=arch, python_abi=lock.python_abi or None
    )


def _go(ctx: BuildContext, lock: PackageLock) -> BuildOutput:
    env = go_env(offline())
    env.update(GOOS="linux", GOFLAGS="", GOBIN=str((ctx.stage_dir / "bin").resolve()))
    cwd = ctx.cache_dir.resolve()
    cwd.mkdir(parents=True, exist_ok=True)  # outside any module: `go install pkg@version` builds it alone
    found = _run(ctx, ["go", "mod", "download", "-json", f"{lock.module}@{lock.version}"], cwd, env)
    locked = next(f.hash for f in lock.fetched if f.name == lock.module)
    if f'"Sum": "{locked}"' not in found:
        raise BuildFailed(
            "go",
            ctx.bundle.name,
            ["go", "mod", "download"],
            f"{lock.module}@{lock.version} does not match its locked hash {locked}",
        )
    arch = _run(ctx, ["go", "env", "GOARCH"], cwd, env).strip()
    ctx.log(f"go install {lock.package}@{lock.version} -> bin/ (linux/{arch})")
    _run(
        ctx,
        ["go", "install", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", f"{lock.package}@{lock.version}"],
        cwd,
        env,
    )
    return BuildOutput(os="linux", arch=arch)


def _cargo(ctx: BuildContext, lock: PackageLock) -> BuildOutput:
    cargo, host, _release = TOOLCHAIN._tools()
    binary = lock.entry[0].removeprefix("bin/")
    crate = next(f for f in lock.fetched if f.name == lock.package and f.version == lock.version)
    cached = [p for p in (cargo_home() / "registry" / "cache").glob(f"*/{crate.file}") if p.is_file()]
    if cached and f"sha256:{hashlib.sha256(cached[0].read_bytes()).hexdigest()}" != crate.hash:
        raise BuildFailed(
            "rust", ctx.bundle.name, ["cargo", "install"], f"{cached[0]} does not match its locked hash {crate.hash}"
        )
    # A fixed target folder per crate version: the build is incremental, and its paths are remapped.
    # Kept within the cache bound with the Rust toolchain's own folders (toolchains/cache_bound.py).
    home = (ctx.cache_dir / "packages" / f"{lock.package}-{lock.version}").resolve()
    env = dict(_build_env(cargo, home / "none", home / "target"))
    env.update({k: v for k, v in cargo_env(offline()).items() if k.startswith("CARGO_NET")})
    with holding(Kept(home, home / ".lock")), tempfile.TemporaryDirectory(dir=home, prefix="root-") as root:
        _prune(ctx.cache_dir, ctx.cache_bound, ctx.log)
        command = [cargo, "install", "--locked", "--root", root, "--bin", binary, f"{lock.package}@{lock.version}"]
        ctx.log(f"cargo install --locked {lock.package}@{lock.version} -> bin/{binary}")
        _run(ctx, [*command, "-j", str(JOBS), "--color", "never"], home, env)
        target = ctx.stage_dir / "bin" / binary
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(root) / "bin" / binary, target)
    target.chmod(0o755)
    return BuildOutput(os="linux", arch=ARCHES.get(host.split("-")[0], host.split("-")[0]))
