"""What every language's builder implements, and the facts it is given.

A toolchain turns a bundle's source folder into a staged folder: everything the bundle needs
at run time, with the entry (the manifest's `entry`, argv relative to that folder) present.
Packing the staged folder into the artifact (`bundle.json`, hashes, reproducible tar) is
`toolchains.artifact`'s job, not the toolchain's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from manifests import BundleManifest, LoadedModule

from .cache_bound import CacheBound


class ToolchainMissing(Exception):
    """A compiler or tool a build needs is not installed; says what to install."""

    def __init__(self, language: str, tool: str, install: str) -> None:
        self.language, self.tool, self.install = language, tool, install
        super().__init__(f"building a {language} bundle needs `{tool}`, which is not installed: {install}")


class BuildFailed(Exception):
    """The compiler ran and failed; `output` is the tail of what it printed."""

    def __init__(self, language: str, bundle: str, command: list[str], output: str) -> None:
        self.language, self.bundle, self.command, self.output = language, bundle, command, output
        super().__init__(f"{language} build of bundle {bundle!r} failed: {' '.join(command)}\n{output}")


@dataclass(frozen=True)
class BuildContext:
    module: LoadedModule
    bundle: BundleManifest
    source_dir: Path  # the bundle's own code (resolved `source`)
    stage_dir: Path  # empty folder; what is put here is the bundle
    cache_dir: Path  # kept between builds (compiler caches); never packed
    repo_root: Path | None  # this project's checkout, for SDKs referenced by path; None outside it
    log: Callable[[str], None] = print
    cache_bound: CacheBound = field(default_factory=CacheBound)  # what the toolchain keeps in cache_dir


@dataclass(frozen=True)
class BuildOutput:
    # Environment the runtime adds when it runs the bundle; "{bundle_dir}" is replaced by the
    # unpacked folder (e.g. PYTHONPATH for vendored Python packages).
    env: dict[str, str] = field(default_factory=dict)
    os: str | None = None  # set for compiled languages: "linux"
    arch: str | None = None  # "amd64", "arm64"
    # A Python bundle with compiled wheels runs only on this CPython ABI ("cp311").
    python_abi: str | None = None


class Toolchain(Protocol):
    language: str

    def check(self) -> None:
        """Raise ToolchainMissing when a tool the build needs is absent."""

    def build(self, ctx: BuildContext) -> BuildOutput:
        """Compile and stage the bundle into ctx.stage_dir; raise BuildFailed on failure."""
