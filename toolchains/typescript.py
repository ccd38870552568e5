"""The TypeScript toolchain: `tsc` compiles, esbuild packs the entry and its dependencies into one file.

The staged bundle is `<entry script>` (e.g. `dist/main.js`, every dependency inlined) plus a
minimal `package.json` that tells node the file's module format. No node_modules, no links: it
runs with the node binary alone, starts faster than a tree of packages, and holds nothing that
points out of the bundle.

Steps, all in a scratch copy under ctx.cache_dir (npm and tsc write into the folder they run in,
and the source tree must stay clean). The scratch is kept, one per set of packages (by place)
and their package.json and package-lock.json, with each package's installed node_modules: the
next build of the same packages (another node state folder, a rebuild after a source change)
copies the sources in afresh but skips `npm ci` when node_modules was installed from the same
files (a stamp inside node_modules says from which). Builds sharing a scratch take turns.
1. Copy the source and every `file:` dependency it names (e.g. `@mesh/sdk` ->
   `file:../../../sdk/typescript`, and theirs in turn) keeping their relative layout, so the
   `file:` paths resolve inside the scratch as they are written.
2. Dependencies first, then the bundle: `npm ci` (the committed package-lock.json, install
   scripts off) and `npm run build` (or `tsc -p .` when there is a tsconfig and no build script).
3. esbuild (a devDependency of the bundle, so its version is locked with the rest) bundles the
   entry script for node 20 into the stage.

Reproducible: package-lock.json pins every package, tsc emits no source maps or timestamps, and
esbuild's output depends only on its inputs and their paths relative to the scratch folder, which
mirrors the repository's layout wherever the scratch is. Packages are fetched through npm's own
cache (`--prefer-offline`), which scripts/setup-typescript.sh fills ahead of an offline build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any

from .base import BuildContext, BuildFailed, BuildOutput, ToolchainMissing, run_tool
from .cache_bound import Kept, holding, prune

LANGUAGE = "typescript"
MIN_NODE = 20
# esbuild's target: the oldest node the runtime supports, fixed so every build machine emits the same code.
NODE_TARGET = f"node{MIN_NODE}"
INSTALL_HINT = (
    f"install Node.js {MIN_NODE} or newer with npm, e.g. `apt-get install nodejs npm` "
    "(Debian 13 and later) or from https://nodejs.org/en/download"
)
BUILD_TIMEOUT_S = 900  # a cold npm cache on a slow link
DEPENDENCY_FIELDS = ("dependencies", "devDependencies", "optionalDependencies")
SCRATCH_PREFIX = "ts-build-"  # a scratch per build (before issue 16); swept when stale
SHARED_PREFIX = "ts-shared-"  # a scratch per set of packages and lock files, kept
INSTALLED_STAMP = ".mesh-installed"  # in node_modules: the digest of what it was installed from
STALE_SCRATCH_S = 6 * 3600  # far longer than any build; an older scratch was left by a killed one


class TypeScriptToolchain:
    language = LANGUAGE

    def check(self) -> None:
        node = shutil.which("node")
        if node is None:
            raise ToolchainMissing(LANGUAGE, "node", INSTALL_HINT)
        if shutil.which("npm") is None:
            raise ToolchainMissing(LANGUAGE, "npm", INSTALL_HINT)
        version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
        match = re.match(r"v(\d+)\.", version)
        if match is None or int(match.group(1)) < MIN_NODE:
            raise ToolchainMissing(
                LANGUAGE, f"node {MIN_NODE} or newer (found {version or 'no version'})", INSTALL_HINT
            )

    def build(self, ctx: BuildContext) -> BuildOutput:
        self.check()
        entry = _entry_script(ctx)
        packages = _packages_in_build_order(ctx, ctx.source_dir.resolve())
        # One common ancestor keeps every relative `file:` path valid inside the scratch copy.
        root = Path(os.path.commonpath([str(p) for p in packages]))
        ctx.cache_dir.mkdir(parents=True, exist_ok=True)
        _sweep_stale_scratches(ctx.cache_dir)
        scratch = _shared_scratch(ctx, packages, root)
        # One build at a time per scratch: builds with the same packages and locks share it.
        with holding(_kept_one(scratch)):
            prune(_kept(ctx.cache_dir), ctx.cache_bound, ctx.log)
            for package in packages:
                _clear_except_installed(scratch / package.relative_to(root))
            for package in packages:
                _copy_package(package, scratch / package.relative_to(root))
            for package in packages:
                shown = package.relative_to(root).as_posix() or "."
                _install_and_compile(ctx, scratch / package.relative_to(root), shown)
            source = scratch / ctx.source_dir.resolve().relative_to(root)
            manifest = _read_package_json(ctx, source)
            fmt = _module_format(entry, manifest)
            _pack(ctx, source, entry, fmt)
            target = ctx.stage_dir / entry
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / ".mesh-out" / entry, target)
        _write_stage_package_json(ctx, manifest, fmt)
        return BuildOutput()


def _entry_script(ctx: BuildContext) -> PurePosixPath:
    """The script the manifest's entry runs (["node", "dist/main.js"]): what esbuild writes."""
    entry = ctx.bundle.entry
    script = PurePosixPath(entry[1]) if len(entry) > 1 else None
    if entry[0] != "node" or script is None or script.is_absolute() or ".." in script.parts:
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["entry"],
            f'entry is {entry!r}; a TypeScript bundle\'s entry is ["node", "<script inside the bundle>"], '
            'e.g. ["node", "dist/main.js"]',
        )
    if script.suffix not in (".js", ".mjs", ".cjs"):
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["entry"],
            f"entry script {str(script)!r} is not a .js, .mjs or .cjs file that tsc emits",
        )
    return script


def _packages_in_build_order(ctx: BuildContext, source: Path) -> list[Path]:
    """The bundle's package and every local `file:` package it needs, dependencies first."""
    order: list[Path] = []
    visiting: set[Path] = set()

    def visit(package: Path) -> None:
        if package in order or package in visiting:
            return  # built already, or a cycle, which npm itself will report
        visiting.add(package)
        for target in _file_dependencies(ctx, package):
            visit(target)
        order.append(package)

    visit(source)
    return order


def _file_dependencies(ctx: BuildContext, package: Path) -> list[Path]:
    manifest = _read_package_json(ctx, package)
    found = []
    for field in DEPENDENCY_FIELDS:
        for name, spec in (manifest.get(field) or {}).items():
            if not isinstance(spec, str) or not spec.startswith("file:"):
                continue
            target = (package / spec[len("file:") :]).resolve()
            if not (target / "package.json").is_file():
                raise BuildFailed(
                    LANGUAGE,
                    ctx.bundle.name,
                    ["npm", "ci"],
                    f"{package / 'package.json'}: {field}.{name} is {spec!r}, but {target} holds no package.json",
                )
            found.append(target)
    return found


def _read_package_json(ctx: BuildContext, package: Path) -> dict[str, Any]:
    path = package / "package.json"
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["npm", "ci"],
            f"{path} is missing; a TypeScript bundle's source is an npm package",
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildFailed(LANGUAGE, ctx.bundle.name, ["npm", "ci"], f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise BuildFailed(LANGUAGE, ctx.bundle.name, ["npm", "ci"], f"{path} is not a JSON object")
    return data


def _copy_package(source: Path, dest: Path) -> None:
    """Copy a package's own files: not its installed packages, not an earlier build's output."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {"node_modules", ".git"}
        if Path(folder) == source:
            skipped |= {"dist", ".mesh-out"}
        return skipped & set(names)

    # dirs_exist_ok: a `file:` package inside the bundle's own folder is copied with it and again alone.
    shutil.copytree(source, dest, ignore=ignore, symlinks=True, dirs_exist_ok=True)


def _shared_scratch(ctx: BuildContext, packages: list[Path], root: Path) -> Path:
    """The scratch of every build of these packages (by place) with these package.json and lock files.

    Kept between builds, with each package's installed `node_modules`: a second node state
    folder or a renamed copy of the module then skips `npm ci` (see `_install_and_compile`).
    """
    digest = hashlib.sha256()
    for package in packages:
        digest.update(package.relative_to(root).as_posix().encode() + b"\0")
        for name in ("package.json", "package-lock.json"):
            path = package / name
            digest.update(path.read_bytes() if path.is_file() else b"-")
            digest.update(b"\0")
    return ctx.cache_dir.resolve() / f"{SHARED_PREFIX}{digest.hexdigest()[:16]}"


def _kept_one(scratch: Path) -> Kept:
    return Kept(scratch, scratch.with_name(scratch.name + ".lock"))


def _kept(cache_dir: Path) -> list[Kept]:
    """Every kept scratch (or a lock file left of one): what the cache bound counts and prunes."""
    names = {p.name.removesuffix(".lock") for p in cache_dir.glob(f"{SHARED_PREFIX}*")}
    return [_kept_one(cache_dir.resolve() / name) for name in sorted(names)]


def _clear_except_installed(folder: Path) -> None:
    """Empty a package's place in the scratch, keeping its installed packages (node_modules)."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name == "node_modules":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _sweep_stale_scratches(cache_dir: Path) -> None:
    """Remove scratch folders a killed build left behind (each holds a full node_modules)."""
    now = time.time()
    for folder in cache_dir.glob(f"{SCRATCH_PREFIX}*"):
        try:
            if now - folder.stat().st_mtime > STALE_SCRATCH_S:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # another build removed it first


def _install_and_compile(ctx: BuildContext, package: Path, shown: str) -> None:
    if not (package / "package-lock.json").is_file():
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["npm", "ci"],
            f"{shown} has no package-lock.json; run `npm install` there and commit the lock file "
            "(it pins every package, which a reproducible build needs)",
        )
    # What node_modules was installed from; the same again means `npm ci` would install the same.
    installed = hashlib.sha256(
        (package / "package.json").read_bytes() + b"\0" + (package / "package-lock.json").read_bytes()
    )
    stamp = package / "node_modules" / INSTALLED_STAMP
    if stamp.is_file() and stamp.read_text() == installed.hexdigest():
        ctx.log(f"npm ci in {shown}: installed already from this package-lock.json")
    else:
        ctx.log(f"npm ci in {shown}")
        # Install scripts stay off: a build runs no code from the registry beyond the compilers it calls.
        _run(ctx, ["npm", "ci", "--ignore-scripts", "--prefer-offline", "--no-audit", "--no-fund"], package)
        stamp.parent.mkdir(exist_ok=True)  # a package without dependencies has none
        stamp.write_text(installed.hexdigest())
    scripts = _read_package_json(ctx, package).get("scripts") or {}
    if "build" in scripts:
        ctx.log(f"npm run build in {shown}")
        _run(ctx, ["npm", "run", "build"], package)
    elif (package / "tsconfig.json").is_file():
        ctx.log(f"tsc in {shown}")
        _run(ctx, [str(_bin(ctx, package, "tsc", "typescript")), "-p", "."], package)


def _module_format(entry: PurePosixPath, manifest: dict[str, Any]) -> str:
    """The format node will load the entry in, which the packed file must be written in."""
    if entry.suffix == ".mjs":
        return "esm"
    if entry.suffix == ".cjs":
        return "cjs"
    return "esm" if manifest.get("type") == "module" else "cjs"


def _pack(ctx: BuildContext, source: Path, entry: PurePosixPath, fmt: str) -> None:
    if not (source / entry).is_file():
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            ["npm", "run", "build"],
            f"the build did not produce {entry}, which the entry runs; check tsconfig's outDir and rootDir",
        )
    esbuild = _bin(ctx, source, "esbuild", "esbuild")
    command = [
        str(esbuild),
        str(entry),
        "--bundle",
        "--platform=node",
        f"--format={fmt}",
        f"--target={NODE_TARGET}",
        f"--outfile={PurePosixPath('.mesh-out') / entry}",
        "--log-level=warning",
    ]
    ctx.log(f"esbuild {entry} -> one file ({fmt}, {NODE_TARGET})")
    warnings = _run(ctx, command, source)
    if warnings:
        ctx.log(warnings)  # e.g. a dynamic require esbuild could not follow: it would fail at run time


def _bin(ctx: BuildContext, package: Path, tool: str, npm_package: str) -> Path:
    path = package / "node_modules" / ".bin" / tool
    if not path.exists():
        raise BuildFailed(
            LANGUAGE,
            ctx.bundle.name,
            [tool],
            f"`{tool}` is not installed in the bundle's package; add it with `npm install --save-dev {npm_package}` "
            f"in {ctx.source_dir} and commit package.json and package-lock.json",
        )
    return path


def _write_stage_package_json(ctx: BuildContext, manifest: dict[str, Any], fmt: str) -> None:
    """Only what node reads at run time: the module format (and a name for people)."""
    staged: dict[str, Any] = {
        "name": manifest.get("name") or ctx.module.module.name,
        "version": manifest.get("version") or ctx.module.module.version,
        "private": True,
        "type": "module" if fmt == "esm" else "commonjs",
    }
    (ctx.stage_dir / "package.json").write_text(json.dumps(staged, indent=2) + "\n", "utf-8")


def _run(ctx: BuildContext, command: list[str], cwd: Path) -> str:
    """Run one build step; its output on success, BuildFailed with the output's tail on failure."""
    env = dict(os.environ)
    # npm's nags and update checks are noise in a build log and a network call an offline build must not make.
    env.update({"npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"})
    return run_tool(
        LANGUAGE,
        ctx.bundle.name,
        command,
        cwd=cwd,
        env=env,
        timeout_s=BUILD_TIMEOUT_S,
        install=INSTALL_HINT,
        with_stderr=True,
    )


TOOLCHAIN = TypeScriptToolchain()
