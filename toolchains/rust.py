"""The Rust toolchain: `cargo build --release --locked` of the bundle's binary crate.

The binary is the whole bundle: it goes to `<stage>/<entry[0]>` (e.g. `bin/hello-rust`), and
the cargo binary target it comes from is named like the entry's last part.

The build is reproducible, wherever the checkout and the cache are:
- Cargo hashes a path dependency that lies outside the workspace by its absolute path, and that
  hash reaches symbol names and so the layout of the binary. So the bundle and its path
  dependencies (the SDK, `../../../sdk/rust`) are mirrored into a scratch workspace under the
  cache, keeping their relative places, with a generated workspace root above them: every path
  is then inside the workspace and hashed relative to it.
- `--remap-path-prefix` maps the scratch workspace, the cargo home (crates.io sources) and the
  target folder to fixed names, so no build path is left in panic messages.
- Symbols are stripped, and `--locked` builds the committed Cargo.lock as it is.
The same source, lock file and Rust version give the same bytes. Nothing is written into the
source tree: the copy and cargo's target folder both live under the cache.

Built once: the scratch workspace and the target folder are keyed by the Rust version and the
bundle's Cargo.lock, not by the module's name, so a renamed copy of a module, or another bundle
locked to the same crates, reuses every compiled dependency (only its own crate is compiled).
The workspace's path is the same for every build under one key, so the flags that name it (the
path remap) are the same too and cargo's fingerprints of the dependencies still hold. Keys that
are no longer used are removed within the node's cache bound (toolchains/cache_bound.py), and so
are the per-module folders of the layout before the key.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Callable

from .base import BuildContext, BuildFailed, BuildOutput, ToolchainMissing, run_tool
from .cache_bound import CacheBound, Kept, holding, prune

LANGUAGE = "rust"
INSTALL_HINT = (
    "install Rust 1.88 or newer with rustup (https://rustup.rs: `curl https://sh.rustup.rs -sSf | sh`), "
    "or `apt-get install cargo` where Debian's Rust is new enough"
)
MIN_RUST = (1, 88)  # rmcp, the MCP library the SDK wraps, needs it
ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
# Two cores on the project's machines: more jobs only add memory pressure.
JOBS = max(1, min(2, os.cpu_count() or 1))
BUILD_TIMEOUT_S = 1800  # a cold crates download plus a cold release build on a small machine


class RustToolchain:
    language = LANGUAGE

    def check(self) -> None:
        self._tools()

    def build(self, ctx: BuildContext) -> BuildOutput:
        cargo, host, release = self._tools()
        source = ctx.source_dir.resolve()
        name = _binary_name(ctx)
        for needed, why in (
            ("Cargo.toml", "a Rust bundle's source is a cargo package with a binary target"),
            ("Cargo.lock", "commit the lock file (`cargo generate-lockfile`) so builds are repeatable"),
        ):
            if not (source / needed).is_file():
                raise BuildFailed(LANGUAGE, ctx.bundle.name, [cargo, "build"], f"{source} has no {needed}; {why}")
        arch = ARCHES.get(host.split("-")[0])
        if arch is None or "-linux" not in host:
            raise BuildFailed(
                LANGUAGE,
                ctx.bundle.name,
                [cargo, "build"],
                f"rustc builds for {host}; bundles run on linux amd64 or arm64 nodes",
            )

        home = _shared_home(ctx.cache_dir, release, source)
        said = f"rust: waiting for another build that shares {home.name} (the same Rust and Cargo.lock)"
        # One build at a time per key: the builds under it share the scratch copy and the target.
        with holding(Kept(home, home / ".lock"), on_wait=lambda: ctx.log(said)):
            _prune(ctx.cache_dir, ctx.cache_bound, ctx.log)
            workspace, package = _mirror(ctx, source, home / "workspace")
            target = home / "target"
            env = _build_env(cargo, workspace, target)
            command = [cargo, "build", "--release", "--locked", "--bin", name, "-j", str(JOBS), "--color", "never"]
            ctx.log(f"rust: building bundle {ctx.bundle.name!r} -> {ctx.bundle.entry[0]} (linux/{arch})")
            _run(ctx, command, package, env)
            built = target / "release" / name
            if not built.is_file():
                raise BuildFailed(LANGUAGE, ctx.bundle.name, command, f"cargo reported success but wrote no {built}")
            output = ctx.stage_dir / ctx.bundle.entry[0]
            output.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, output)  # contents only: no timestamps or owner carried over
        output.chmod(0o755)
        return BuildOutput(os="linux", arch=arch)

    def _tools(self) -> tuple[str, str, str]:
        """cargo's path, rustc's host triple and release; ToolchainMissing when absent or too old."""
        cargo = _find("cargo")
        rustc = _find("rustc")
        if cargo is None:
            raise ToolchainMissing(LANGUAGE, "cargo", INSTALL_HINT)
        if rustc is None:
            raise ToolchainMissing(LANGUAGE, "rustc", INSTALL_HINT)
        if shutil.which("cc") is None:  # rustc links through the system C compiler
            raise ToolchainMissing(LANGUAGE, "cc (the linker rustc uses)", "apt-get install gcc")
        try:
            info = subprocess.run([rustc, "-vV"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            info = ""
        release = re.search(r"^release: (\d+)\.(\d+)", info, re.M)
        host = re.search(r"^host: (\S+)", info, re.M)
        if release is None or host is None:
            raise ToolchainMissing(LANGUAGE, "a working rustc (`rustc -vV` failed)", INSTALL_HINT)
        if (int(release[1]), int(release[2])) < MIN_RUST:
            found = f"{release[1]}.{release[2]}"
            raise ToolchainMissing(
                LANGUAGE,
                f"rustc {MIN_RUST[0]}.{MIN_RUST[1]}+ (found {found})",
                "`rustup update stable`, or " + INSTALL_HINT,
            )
        full = re.search(r"^release: (\S+)", info, re.M)
        return cargo, host[1], full[1] if full else f"{release[1]}.{release[2]}"


def _shared_home(cache_dir: Path, release: str, source: Path) -> Path:
    """The cache folder of every build with this Rust release and this Cargo.lock."""
    digest = hashlib.sha256((source / "Cargo.lock").read_bytes()).hexdigest()[:16]
    return (cache_dir / "shared" / f"rustc-{release}-lock-{digest}").resolve()


def _prune(cache_dir: Path, bound: CacheBound, log: Callable[[str], None]) -> list[Path]:
    """Keep the Rust cache within `bound`; the old layout's module folders go once empty."""
    old = _old_layout(cache_dir)
    removed = prune(_kept(cache_dir), bound, log, old_layout=old)
    for module in {item.folder.parent for item in old}:
        with contextlib.suppress(OSError):  # not empty: another bundle's folder is in use
            module.rmdir()
    return removed


def _kept(cache_dir: Path) -> list[Kept]:
    """What the cache bound counts and prunes: every keyed folder under `shared`, and under
    `packages` every imported crate's build (toolchains/packaged.py)."""
    folders = []
    for kind in ("shared", "packages"):
        if (cache_dir / kind).is_dir():
            folders += sorted(p for p in (cache_dir / kind).iterdir() if p.is_dir())
    return [Kept(folder, folder / ".lock") for folder in folders]


def _old_layout(cache_dir: Path) -> list[Kept]:
    """The folders of the layout before the shared key: `<module>/<bundle>/` with its own
    workspace and target, which no build reuses any more."""
    found = []
    for module in sorted(cache_dir.iterdir()) if cache_dir.is_dir() else []:
        if module.name in ("shared", "packages") or not module.is_dir():
            continue  # the keyed folders; imported packages' builds (toolchains/packaged.py)
        for bundle in sorted(module.iterdir()):
            if (bundle / ".lock").is_file() and (bundle / "workspace").is_dir():
                found.append(Kept(bundle, bundle / ".lock"))
    return found


def _cargo_home() -> Path:
    return Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo").resolve()


def _find(tool: str) -> str | None:
    """`tool` on PATH, else in cargo's home: rustup installs there and not every shell has it on PATH."""
    found = shutil.which(tool)
    if found is None:
        candidate = _cargo_home() / "bin" / tool
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found = str(candidate)
    return found


def _binary_name(ctx: BuildContext) -> str:
    """The cargo binary target: the last part of entry[0], which names where the binary goes."""
    entry = PurePosixPath(ctx.bundle.entry[0])
    if entry.is_absolute() or ".." in entry.parts or entry.name in ("", "."):
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["cargo", "build"],
            f"entry[0] {ctx.bundle.entry[0]!r} must name the binary inside the bundle, "
            f'e.g. "bin/{ctx.module.module.name}"',
        )
    return entry.name


def _path_packages(ctx: BuildContext, package: Path) -> list[Path]:
    """`package` and every package it reaches through `path = ...` dependencies, resolved."""
    found: list[Path] = []
    todo = [package]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        try:
            manifest = tomllib.loads((current / "Cargo.toml").read_text("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise BuildFailed(
                LANGUAGE, ctx.bundle.name, ["cargo", "build"], f"cannot read {current / 'Cargo.toml'}: {e}"
            ) from None
        tables = [manifest] + list(manifest.get("target", {}).values())
        for table in tables:
            for kind in ("dependencies", "build-dependencies", "dev-dependencies"):
                for spec in table.get(kind, {}).values():
                    if isinstance(spec, dict) and isinstance(spec.get("path"), str):
                        todo.append((current / spec["path"]).resolve())
    return found


def _mirror(ctx: BuildContext, source: Path, workspace: Path) -> tuple[Path, Path]:
    """Copy the bundle and its path dependencies under `workspace`, keeping their relative
    places, and write a workspace root there; return (workspace, the bundle's copy)."""
    manifest = tomllib.loads((source / "Cargo.toml").read_text("utf-8"))
    if "workspace" in manifest:
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["cargo", "build"],
            f"{source / 'Cargo.toml'} declares a [workspace]; a Rust bundle is one package: remove it",
        )
    packages = _path_packages(ctx, source)
    base = Path(os.path.commonpath(packages))
    if base in packages:  # the workspace root needs its own folder above every package
        base = base.parent
    if workspace.exists():
        shutil.rmtree(workspace)
    for package in packages:
        if not (package / "Cargo.toml").is_file():
            raise BuildFailed(
                LANGUAGE, ctx.bundle.name, ["cargo", "build"], f"path dependency {package} has no Cargo.toml"
            )
        # copy2 keeps modification times, so cargo does not recompile what did not change.
        shutil.copytree(
            package,
            workspace / package.relative_to(base),
            dirs_exist_ok=True,
            ignore=lambda folder, names, top=package: _skipped(Path(folder), names, top),
        )
    member = source.relative_to(base).as_posix()
    # Path dependencies stay out of the membership, as in the bundle's own workspace, so the
    # committed Cargo.lock (which lists no dev-dependencies of theirs) fits as it is.
    others = sorted(p.relative_to(base).as_posix() for p in packages if p != source)
    edition = manifest.get("package", {}).get("edition", "2015")
    resolver = {"2024": "3", "2021": "2"}.get(edition, "1")
    root = {
        "workspace": {"members": [member], "exclude": others, "resolver": resolver},
        # Profiles count only at the workspace root: carry the bundle's own over.
        "profile": _release_profile(manifest.get("profile")),
    }
    (workspace / "Cargo.toml").write_text("".join(f"{_toml(k)} = {_toml(v)}\n" for k, v in root.items()))
    shutil.copy2(source / "Cargo.lock", workspace / "Cargo.lock")
    return workspace, workspace / member


def _release_profile(own: object) -> dict[str, object]:
    """The bundle's own profiles, with one codegen unit for the dependencies unless it says otherwise.

    Cargo's release default splits every crate into 16 units for parallel code generation. The
    dependencies here (tokio, rmcp, serde, ...) are mostly generic code compiled for one binary:
    splitting them cost more than it gained, a cold build of hello-rust took 93 s of CPU and 71 s
    on two cores with 16 units against 79 s and 57 s with one (one unit is also the setting that
    optimizes best). The bundle's own crate keeps 16, so a one-line change is compiled in parallel.
    """
    profiles = copy.deepcopy(own) if isinstance(own, dict) else {}
    release = profiles.setdefault("release", {})
    if isinstance(release, dict):
        packages = release.setdefault("package", {})
        if isinstance(packages, dict):
            every = packages.setdefault("*", {})
            if isinstance(every, dict):
                every.setdefault("codegen-units", 1)
    return profiles


def _skipped(folder: Path, names: list[str], package: Path) -> list[str]:
    """What not to copy: build output and VCS data at a package's top."""
    return [n for n in names if folder == package and n in ("target", ".git")]


def _toml(value: object) -> str:
    """A TOML value (inline tables for dicts); the few types a Cargo profile holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _build_env(cargo: str, workspace: Path, target: Path) -> dict[str, str]:
    remaps = [(_cargo_home(), "/cargo"), (workspace, "/mesh"), (target, "/target")]
    flags = [f"--remap-path-prefix={path}={name}" for path, name in remaps]
    env = {k: v for k, v in os.environ.items() if k not in ("RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS")}
    env.update(
        # The encoded form takes paths with spaces; it also overrides any RUSTFLAGS around.
        CARGO_ENCODED_RUSTFLAGS="\x1f".join(flags),
        CARGO_TARGET_DIR=str(target),
        CARGO_PROFILE_RELEASE_STRIP="symbols",  # whatever the bundle's own profile says
        CARGO_TERM_PROGRESS_WHEN="never",
        PATH=os.pathsep.join([str(Path(cargo).parent), env.get("PATH", os.defpath)]),
    )
    return env


def _run(ctx: BuildContext, command: list[str], cwd: Path, env: dict[str, str]) -> None:
    run_tool(LANGUAGE, ctx.bundle.name, command, cwd=cwd, env=env, timeout_s=BUILD_TIMEOUT_S, install=INSTALL_HINT)


TOOLCHAIN = RustToolchain()
