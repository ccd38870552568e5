"""The Go toolchain: `go build` of the bundle's main package into one static binary.

The binary is the whole bundle: it goes to `<stage>/<entry[0]>` (e.g. `bin/hello-go`). The
build is reproducible because nothing machine- or time-specific is baked in: `-trimpath`
drops filesystem paths, `-buildvcs=false` the VCS stamp, `-buildid=` the build ID, and
CGO_ENABLED=0 keeps the C toolchain (and its paths) out. The same source and the same Go
version give the same bytes.

`go build` does not write into the source tree (`-mod=readonly` forbids even go.mod edits),
so it runs in the source folder itself; a `replace` to the SDK by relative path
(`../../../sdk/go`) then resolves inside this checkout as written. A module copied out of the
checkout (a `bundles` folder of one's own) keeps that line, which then points nowhere: the build
is then given a Go workspace file (GOWORK, in a scratch folder, never in the source) whose
`replace` points at this checkout's `sdk/go`, the same SDK the C and Rust builds take from it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from .base import BuildContext, BuildFailed, BuildOutput, ToolchainMissing, run_tool
from .cache_bound import Kept, holding

INSTALL_HINT = (
    "install Go 1.25 or newer from https://go.dev/dl/ "
    "(or `apt-get install golang-go`; an older go fetches the newer toolchain itself)"
)
BUILD_TIMEOUT_S = 900  # a cold module download plus a cold build cache on a small machine
SDK_MODULE = "mesh.local/sdk/go"
_SDK_REPLACE = re.compile(r"^\s*replace\s+" + re.escape(SDK_MODULE) + r"(?:\s+\S+)?\s*=>\s*(\S+)\s*$", re.M)
_GO_LINE = re.compile(r"^go\s+(\S+)\s*$", re.M)


class GoToolchain:
    language = "go"

    def check(self) -> None:
        if shutil.which("go") is None:
            raise ToolchainMissing(self.language, "go", INSTALL_HINT)

    def build(self, ctx: BuildContext) -> BuildOutput:
        self.check()
        if not (ctx.source_dir / "go.mod").is_file():
            raise BuildFailed(
                self.language,
                ctx.bundle.name,
                ["go", "build"],
                f"{ctx.source_dir} has no go.mod; a Go bundle's source is a module with a main package",
            )
        binary = _entry_path(ctx)
        env = _build_env(ctx)
        arch = _run(ctx, ["go", "env", "GOARCH"], env).strip()
        binary.parent.mkdir(parents=True, exist_ok=True)
        command = [
            "go",
            "build",
            "-trimpath",
            "-buildvcs=false",
            "-ldflags=-s -w -buildid=",
            "-o",
            str(binary),
            ".",
        ]
        ctx.log(f"go: building bundle {ctx.bundle.name!r} -> {binary.relative_to(ctx.stage_dir)} (linux/{arch})")
        said = "go: waiting for another Go build (one at a time: they compile the same packages into one cache)"
        with tempfile.TemporaryDirectory(prefix="mesh-gowork-") as scratch, holding(_turns(ctx), lambda: ctx.log(said)):
            workspace = sdk_workspace(ctx, Path(scratch))
            if workspace is not None:
                ctx.log(f"go: {SDK_MODULE} is not beside this copy of the module; using {workspace[1]}")
                env["GOWORK"] = str(workspace[0])
            _run(ctx, command, env)
        return BuildOutput(os="linux", arch=arch)


def _turns(ctx: BuildContext) -> Kept:
    """The lock Go builds take turns on. Concurrent `go build`s do not share work: each compiles
    every package its build cache lacks (the standard library, the SDKs, a SQLite driver), so
    three bundles built at once on a cold cache compiled them three times over. One at a time,
    the second finds them in the cache: on two cores that is sooner for all of them."""
    return Kept(ctx.cache_dir, ctx.cache_dir / "build.lock")


def sdk_workspace(ctx: BuildContext, scratch: Path) -> tuple[Path, Path] | None:
    """A go.work in `scratch` pointing the SDK at this checkout's, when go.mod's relative replace misses.

    None when the replace resolves as written (inside the checkout), when there is none, or when
    it is absolute (the author's choice stands, and its error, if any, is go's own)."""
    go_mod = (ctx.source_dir / "go.mod").read_text()
    found = _SDK_REPLACE.search(go_mod)
    if found is None or not found.group(1).startswith("."):
        return None
    if (ctx.source_dir / found.group(1) / "go.mod").is_file():
        return None
    sdk = (ctx.repo_root / "sdk" / "go").resolve() if ctx.repo_root else None
    if sdk is None or not (sdk / "go.mod").is_file():
        where = str(sdk) if sdk else "no project checkout was given (repo_root)"
        raise BuildFailed(
            "go",
            ctx.bundle.name,
            ["go", "build"],
            f"go.mod replaces {SDK_MODULE} with {found.group(1)}, which is not there, and the mesh Go SDK "
            f"is not found in this checkout either: {where}",
        )
    version = _GO_LINE.search(go_mod)
    work = scratch / "go.work"
    work.write_text(
        f"go {version.group(1) if version else '1.25.0'}\n\nuse {ctx.source_dir.resolve()}\n\n"
        f"replace {SDK_MODULE} => {sdk}\n"
    )
    return work, sdk


def _entry_path(ctx: BuildContext) -> Path:
    """Where the binary goes: the manifest's entry[0], relative to the stage."""
    entry = PurePosixPath(ctx.bundle.entry[0])
    if entry.is_absolute() or ".." in entry.parts or entry.name in ("", "."):
        raise BuildFailed(
            "go",
            ctx.bundle.name,
            ["go", "build"],
            f'entry[0] {ctx.bundle.entry[0]!r} must name the binary inside the bundle, e.g. "bin/{ctx.module.module.name}"',
        )
    return ctx.stage_dir / entry


def _build_env(ctx: BuildContext) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",  # static binary, and no C compiler paths in it
        GOOS="linux",  # the runtime runs bundles on Linux nodes
        # Replaces any inherited GOFLAGS (e.g. -mod=mod or -mod=vendor) so the build reads the
        # committed go.mod/go.sum as they are and never edits them.
        GOFLAGS="-mod=readonly",
    )
    # go's caches live under $HOME by default: content-addressed and shared by every module,
    # bundle and node state folder of the user, so a renamed module builds warm already (moving
    # them under the toolchain cache would make every fresh cache folder build cold). Without a
    # HOME (a bare CI or service account) use the toolchain cache folder instead of failing.
    if not env.get("GOCACHE") and not env.get("HOME") and not env.get("XDG_CACHE_HOME"):
        env["GOCACHE"] = str(ctx.cache_dir / "go-build")
    if not env.get("GOPATH") and not env.get("HOME"):
        env["GOPATH"] = str(ctx.cache_dir / "gopath")
    return env


def _run(ctx: BuildContext, command: list[str], env: dict[str, str]) -> str:
    return run_tool(
        "go", ctx.bundle.name, command, cwd=ctx.source_dir, env=env, timeout_s=BUILD_TIMEOUT_S, install=INSTALL_HINT
    )


TOOLCHAIN = GoToolchain()
