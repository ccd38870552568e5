"""What every language's builder implements, and the facts it is given.

A toolchain turns a bundle's source folder into a staged folder: everything the bundle needs
at run time, with the entry (the manifest's `entry`, argv relative to that folder) present.
Packing the staged folder into the artifact (`bundle.json`, hashes, reproducible tar) is
`toolchains.artifact`'s job, not the toolchain's.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol

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


def default_cache_dir() -> Path:
    """Where the toolchains keep their caches: MESH_TOOLCHAIN_CACHE, else ~/.cache/mesh-node/toolchains."""
    if os.environ.get("MESH_TOOLCHAIN_CACHE"):
        return Path(os.environ["MESH_TOOLCHAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mesh-node" / "toolchains"


OUTPUT_TAIL_LINES = 40  # of a failed step's output, in BuildFailed


def run_tool(
    language: str,
    bundle: str,
    command: list[str],
    *,
    cwd: Path | str | None,
    env: Mapping[str, str] | None,
    timeout_s: float,
    install: str,
    stdin: str | None = None,
    with_stderr: bool = False,
) -> str:
    """Run one build step of a toolchain: its stdout on success; BuildFailed with the output's tail
    when it fails or runs past `timeout_s`; ToolchainMissing (saying `install`) when the tool is absent.

    `with_stderr`: what it printed on both, for a tool that warns on stderr (esbuild). Every toolchain's
    steps go through here, so each has a timeout and fails the same way."""
    try:
        proc = subprocess.run(
            command,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise BuildFailed(language, bundle, command, f"timed out after {timeout_s:g} s") from None
    except FileNotFoundError:
        raise ToolchainMissing(language, command[0], install) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-OUTPUT_TAIL_LINES:])
        raise BuildFailed(language, bundle, command, tail)
    return (proc.stdout + proc.stderr).strip() if with_stderr else proc.stdout


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
