"""Build every bundle of a module: pick its language's toolchain, stage, check the entry, pack.

The toolchain of language `x` is the module `toolchains.x` with a module-level `TOOLCHAIN`; it is
imported only when a bundle needs it, so a module that uses Go never imports the Rust builder.
Expected failures are typed: ToolchainMissing, BuildFailed (toolchains.base), ManifestError
(manifests), PackRefused (toolchains.artifact) and BuildError below; the CLI renders them.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Callable

from manifests import BundleManifest, LoadedModule, load_module
from manifests.check import refuse_own_image

from .artifact import INTERPRETERS, ArtifactMeta, read_meta
from .base import BuildContext, BuildOutput, Toolchain, default_cache_dir
from .cache_bound import CacheBound
from .pack import pack
from .packaged import build_package, is_packaged

PROJECT_NAME = "mesh-node"  # pyproject's [project] name: how repo_root knows this checkout


class BuildError(Exception):
    """A build that cannot go on for a reason that is not the compiler's output."""


class UnknownToolchain(BuildError):
    def __init__(self, language: str, reason: str) -> None:
        self.language = language
        super().__init__(f"no toolchain for language {language!r}: {reason}")


class EntryMissing(BuildError):
    def __init__(self, module: str, bundle: BundleManifest, reason: str) -> None:
        self.module, self.bundle = module, bundle.name
        super().__init__(
            f"bundle {module}/{bundle.name}: entry {bundle.entry!r} {reason}; the entry is argv relative "
            f"to the unpacked bundle (or starts with {', '.join(sorted(INTERPRETERS))})"
        )


def get_toolchain(language: str) -> Toolchain:
    """The TOOLCHAIN object of `toolchains.<language>`, or UnknownToolchain saying why not."""
    name = f"toolchains.{language}"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the toolchain exists but something it imports does not: a real bug
            raise
        raise UnknownToolchain(language, f"there is no module {name} in this installation") from None
    toolchain = getattr(mod, "TOOLCHAIN", None)
    if toolchain is None:
        raise UnknownToolchain(language, f"{name} defines no TOOLCHAIN object")
    if getattr(toolchain, "language", None) != language:
        raise UnknownToolchain(language, f"{name}.TOOLCHAIN says it builds {getattr(toolchain, 'language', None)!r}")
    return toolchain


def find_repo_root(start: Path) -> Path | None:
    """This project's checkout holding `start`, else the one this code runs from, else None.

    The SDKs are referenced from there by path: a module copied out of the checkout (a `bundles`
    folder of one's own) builds against the SDKs beside the runtime that builds it; None only
    for a runtime installed without its checkout."""
    return _checkout_holding(start) or _checkout_holding(Path(__file__).resolve().parent)


def _checkout_holding(start: Path) -> Path | None:
    for folder in [start, *start.parents]:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and (folder / "sdk").is_dir():
            try:
                name = tomllib.loads(pyproject.read_text("utf-8")).get("project", {}).get("name")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue
            if name == PROJECT_NAME:
                return folder
    return None


def build_module(
    module_dir: Path | str,
    out_dir: Path | str,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = print,
) -> list[Path]:
    """Build and pack every bundle of the module in `module_dir`; return the artifacts' paths."""
    loaded = load_module(Path(module_dir))
    refuse_own_image(loaded)  # record 0188: a module's own code is never built into an image
    out_dir = Path(out_dir)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    repo_root = find_repo_root(loaded.root)
    # Find and check every toolchain first: a missing compiler is said before minutes of other builds.
    toolchains: dict[str, Toolchain] = {}
    for bundle in loaded.module.bundle:
        if bundle.language not in toolchains:
            toolchain = get_toolchain(bundle.language)
            toolchain.check()
            toolchains[bundle.language] = toolchain
    return [
        _build_bundle(loaded, bundle, toolchains[bundle.language], out_dir, cache_dir, repo_root, progress)
        for bundle in loaded.module.bundle
    ]


def _build_bundle(
    loaded: LoadedModule,
    bundle: BundleManifest,
    toolchain: Toolchain,
    out_dir: Path,
    cache_dir: Path,
    repo_root: Path | None,
    progress: Callable[[str], None],
) -> Path:
    module = loaded.module
    tag = f"[{module.name}/{bundle.name}]"
    progress(f"{tag} building ({bundle.language})...")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mesh-stage-{module.name}-{bundle.name}-") as stage:
        stage_dir = Path(stage)
        output = _stage(loaded, bundle, toolchain, stage_dir, cache_dir, repo_root, progress, CacheBound())
        meta = ArtifactMeta(
            module=module.name,
            bundle=bundle.name,
            version=module.version,
            kind=bundle.kind,
            language=bundle.language,
            entry=list(bundle.entry),
            env=dict(output.env),
            os=output.os,
            arch=output.arch,
            python_abi=output.python_abi,
            manifest=loaded.path.read_text("utf-8"),
        )
        artifact = pack(stage_dir, meta, out_dir)
    files = len(read_meta(artifact).files)
    progress(
        f"{tag} packed {_shown(artifact)} ({_size(artifact.stat().st_size)}, {files} file{'s' * (files != 1)}) "
        f"in {time.monotonic() - started:.1f} s"
    )
    return artifact


def stage_bundle(
    loaded: LoadedModule,
    bundle: BundleManifest,
    stage_dir: Path,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = print,
    cache_bound: CacheBound | None = None,
) -> BuildOutput:
    """Build one bundle into `stage_dir` without packing: how a node runs compiled code from source."""
    toolchain = get_toolchain(bundle.language)
    toolchain.check()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bound = cache_bound if cache_bound is not None else CacheBound()
    return _stage(loaded, bundle, toolchain, stage_dir, cache, find_repo_root(loaded.root), progress, bound)


def _stage(
    loaded: LoadedModule,
    bundle: BundleManifest,
    toolchain: Toolchain,
    stage_dir: Path,
    cache_dir: Path,
    repo_root: Path | None,
    progress: Callable[[str], None],
    cache_bound: CacheBound,
) -> BuildOutput:
    # Each language gets its own cache folder so two toolchains never trip over each other's files.
    language_cache = cache_dir / bundle.language
    language_cache.mkdir(parents=True, exist_ok=True)
    tag = f"[{loaded.module.name}/{bundle.name}]"
    ctx = BuildContext(
        module=loaded,
        bundle=bundle,
        source_dir=loaded.source_dir(bundle),
        stage_dir=stage_dir,
        cache_dir=language_cache,
        repo_root=repo_root,
        log=lambda line: progress(f"{tag} {line}"),
        cache_bound=cache_bound,
    )
    # A published package (imported, with its lock; or a JavaScript one installed by hand) is
    # built from its lock by the registry's client, not compiled.
    output = build_package(ctx) if is_packaged(bundle, ctx.source_dir) else toolchain.build(ctx)
    _check_entry(loaded.module.name, bundle, stage_dir)
    return output


def _check_entry(module: str, bundle: BundleManifest, stage_dir: Path) -> None:
    """The entry must be runnable from the stage; a toolchain bug or a manifest typo shows here."""
    entry0 = bundle.entry[0]
    if entry0 in INTERPRETERS:
        return
    if Path(entry0).is_absolute():
        raise EntryMissing(module, bundle, "starts with an absolute path; name a file inside the bundle")
    path = stage_dir / entry0
    if not path.is_file():
        raise EntryMissing(module, bundle, f"names {entry0!r}, which the {bundle.language} build did not stage")
    if not os.access(path, os.X_OK):
        raise EntryMissing(
            module, bundle, f"names {entry0!r}, which the {bundle.language} build staged without the executable bit"
        )


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"
