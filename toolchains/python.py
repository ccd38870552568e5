"""The Python toolchain: stage the bundle's source and vendor its dependencies into it.

A Python bundle runs on the node's own interpreter (the runtime replaces an entry[0] of
`python`), so nothing is compiled. What the bundle needs beyond the standard library -- the
mesh SDK from this checkout and the bundle's own `requirements.txt` -- is installed into
`_vendor/` inside the bundle and put on PYTHONPATH, so a bundle never depends on what happens
to be installed on the node.

Reproducible: the same source and the same builder environment give the same bytes. pip's
installs are deterministic except for a few files, which are normalised below; the versions
of packages the builder's own environment also has are pinned to those versions, so a new
release on the index does not silently change a rebuilt bundle. A bundle's own requirements
should pin exact versions for the same reason; one that asks for a version other than the
builder's pin of the same package fails the build with pip's conflict report.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import sys
from pathlib import Path

from .base import BuildContext, BuildFailed, BuildOutput, ToolchainMissing, run_tool

VENDOR = "_vendor"
# Never staged: caches, virtual environments, VCS data, a vendor folder from an earlier build.
_SKIP_NAMES = frozenset({"__pycache__", ".venv", "venv", ".git", ".mypy_cache", ".pytest_cache", VENDOR})
_SKIP_SUFFIXES = (".pyc", ".pyo")
# Distributions that come from this checkout, never pinned from the builder's environment.
_LOCAL_DISTS = frozenset({"mesh-sdk", "mesh-node"})
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
BUILD_TIMEOUT_S = 900  # pip vendoring wheels from a cold cache on a slow link


class PythonToolchain:
    language = "python"

    def check(self) -> None:
        # The builder's interpreter is the node's interpreter; it needs pip to vendor packages.
        if not sys.executable or not Path(sys.executable).exists():
            raise ToolchainMissing("python", "python3", "apt-get install python3")
        if importlib.util.find_spec("pip") is None:
            raise ToolchainMissing("python", "pip", f"{sys.executable} -m ensurepip, or apt-get install python3-pip")

    def build(self, ctx: BuildContext) -> BuildOutput:
        self.check()
        if not ctx.source_dir.is_dir():
            raise BuildFailed(
                "python",
                ctx.bundle.name,
                ["copy", str(ctx.source_dir)],
                f"the bundle's source folder {ctx.source_dir} does not exist (manifest field `source`)",
            )
        self._check_entry(ctx)
        _copy_source(ctx.source_dir, ctx.stage_dir)
        vendor = ctx.stage_dir.resolve() / VENDOR
        command = self._pip_command(ctx, vendor)
        if command is None:  # outside this checkout and no requirements.txt: only the source
            return BuildOutput()
        ctx.log(f"python: vendoring dependencies of {ctx.bundle.name!r} into {VENDOR}/")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", SOURCE_DATE_EPOCH="315532800", PIP_NO_INPUT="1")
        run_tool(
            "python",
            ctx.bundle.name,
            command,
            cwd=ctx.cache_dir,
            env=env,
            timeout_s=BUILD_TIMEOUT_S,
            install="python3 -m ensurepip (pip vendors the dependencies)",
        )
        _normalise_vendor(vendor)
        out_os, arch = _platform_if_native(vendor)
        return BuildOutput(env={"PYTHONPATH": "{bundle_dir}/" + VENDOR}, os=out_os, arch=arch)

    def _check_entry(self, ctx: BuildContext) -> None:
        # The usual entry is ["python", "main.py"]: the script must be in the source.
        entry = ctx.bundle.entry
        if entry[0] in ("python", "python3") and len(entry) > 1 and not entry[1].startswith("-"):
            if not (ctx.source_dir / entry[1]).is_file():
                raise BuildFailed(
                    "python",
                    ctx.bundle.name,
                    entry,
                    f"entry names {entry[1]!r}, which is not a file in the bundle's source {ctx.source_dir}",
                )

    def _pip_command(self, ctx: BuildContext, vendor: Path) -> list[str] | None:
        packages: list[str] = []
        cache_dir = ctx.cache_dir.resolve()
        cache_dir.mkdir(parents=True, exist_ok=True)
        if ctx.repo_root is not None:
            packages.append(str(_sdk_copy(ctx.repo_root.resolve() / "sdk" / "python", cache_dir)))
        requirements = ctx.source_dir.resolve() / "requirements.txt"
        if requirements.is_file():
            packages += ["--requirement", str(requirements)]
        if not packages:
            return None
        constraints = cache_dir / "python-constraints.txt"
        constraints.write_text(_constraints())
        return [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-compile",  # no .pyc: they embed timestamps and are rebuilt on the node anyway
            "--no-warn-script-location",
            "--disable-pip-version-check",
            "--target",
            str(vendor),
            "--constraint",
            str(constraints),
            *packages,
        ]


def _copy_source(source: Path, stage: Path) -> None:
    def ignore(_dir: str, names: list[str]) -> set[str]:
        return {n for n in names if n in _SKIP_NAMES or n.endswith(_SKIP_SUFFIXES)}

    # symlinks=False: what a link points at is copied, so nothing outside the source leaks in as a link.
    shutil.copytree(source, stage, ignore=ignore, dirs_exist_ok=True)


def _sdk_copy(sdk: Path, cache_dir: Path) -> Path:
    """A clean copy of the SDK to install from.

    pip builds a local project in place, which would leave `build/` and `*.egg-info` in the
    checkout; building a copy keeps the checkout clean and the input the same every time.
    """
    if not (sdk / "pyproject.toml").is_file():
        raise BuildFailed("python", "-", ["pip", "install", str(sdk)], f"the Python SDK is not at {sdk}")
    copy = cache_dir / "python-sdk"
    if copy.exists():
        shutil.rmtree(copy)

    def ignore(_dir: str, names: list[str]) -> set[str]:
        return {n for n in names if n in _SKIP_NAMES or n == "build" or n.endswith((".egg-info", ".pyc"))}

    shutil.copytree(sdk, copy, ignore=ignore)
    return copy


def _constraints() -> str:
    """`name==version` for every distribution of the builder's interpreter except this project's own."""
    pins = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        canonical = re.sub(r"[-_.]+", "-", name).lower()
        if canonical not in _LOCAL_DISTS:
            pins.add(f"{canonical}=={dist.version}")
    return "".join(f"{p}\n" for p in sorted(pins))


def _normalise_vendor(vendor: Path) -> None:
    """Remove or rewrite what pip writes that differs between builds or names the build machine.

    - `bin/`: console scripts whose first line is the builder's interpreter path; a bundle
      never runs them (its entry is its own script).
    - `*.dist-info/direct_url.json`: the absolute path the SDK was installed from.
    - `__pycache__/`: defensively, in case a build backend compiled something.
    - `RECORD`: drop the lines of the files removed above, so it lists what is really there.
    """
    if not vendor.is_dir():
        return
    shutil.rmtree(vendor / "bin", ignore_errors=True)
    for cache in sorted(vendor.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)
    for pyc in vendor.rglob("*.py[co]"):
        pyc.unlink()
    for direct_url in vendor.glob("*.dist-info/direct_url.json"):
        direct_url.unlink()
    for record in vendor.glob("*.dist-info/RECORD"):
        kept = []
        for line in record.read_text().splitlines():
            path = line.split(",", 1)[0]
            if path.startswith(("../", "bin/")) or path.endswith(("direct_url.json", ".pyc")) or "__pycache__/" in path:
                continue
            kept.append(line)
        record.write_text("".join(f"{line}\n" for line in kept))


def _platform_if_native(vendor: Path) -> tuple[str | None, str | None]:
    """("linux", arch) when a vendored package carries compiled code, else (None, None).

    A wheel with an extension module (pydantic-core, which the MCP library needs, is one)
    runs only on the operating system, architecture and CPython version it was built for.
    """
    if any(vendor.rglob("*.so")):
        machine = platform.machine().lower()
        return ("linux" if sys.platform.startswith("linux") else sys.platform), _ARCH.get(machine, machine)
    return None, None


TOOLCHAIN = PythonToolchain()
