"""The C toolchain: gcc compiles a bundle's `.c` files together with the mesh's C SDK.

The result is one stripped binary at the path the manifest's entry names, linked statically
against jansson (the SDK's JSON library) so the node needs nothing but glibc. Each source is
compiled on its own into a scratch folder under the cache, with absolute paths mapped away,
so the same source gives the same bytes wherever it is checked out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from .base import BuildContext, BuildFailed, BuildOutput, ToolchainMissing, run_tool

COMPILER = "gcc"
JSON_PACKAGE = "libjansson-dev"  # header and static library of jansson, the SDK's JSON library
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"]
LDFLAGS = ["-s", "-Wl,-z,relro,-z,now", "-Wl,--as-needed"]
LIBS = ["-l:libjansson.a"]  # the static archive by name: the bundle carries jansson inside
ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
TIMEOUT_S = 600


class CToolchain:
    language = "c"

    def check(self) -> None:
        if shutil.which(COMPILER) is None:
            raise ToolchainMissing(self.language, COMPILER, f"apt-get install {COMPILER}")
        # Preprocessing one include proves the header is where gcc looks; asking for the archive
        # by name proves the static library is too (gcc echoes the bare name when it is absent).
        probe = _run_quiet([COMPILER, "-E", "-x", "c", "-", "-o", os.devnull], stdin="#include <jansson.h>\n")
        archive = _run_quiet([COMPILER, "-print-file-name=libjansson.a"]).stdout.strip()
        if probe.returncode != 0 or not os.path.isabs(archive):
            raise ToolchainMissing(
                self.language, "jansson (jansson.h, libjansson.a)", f"apt-get install {JSON_PACKAGE}"
            )

    def build(self, ctx: BuildContext) -> BuildOutput:
        self.check()
        bundle = ctx.bundle.name
        sdk = _sdk_dir(ctx)
        output = _entry_path(ctx)
        source = ctx.source_dir.resolve()
        own = sorted(p.relative_to(source) for p in source.rglob("*.c") if p.is_file())
        if not own:
            raise BuildFailed(self.language, bundle, [], f"no .c files in the bundle's source folder {source}")
        arch = _arch(bundle)
        # (file, where its folder is mapped to in the binary): the bundle's own at ".", the SDK at "sdk/c".
        units = [(source / rel, source, ".") for rel in own]
        units += [(p, sdk, "sdk/c") for p in sorted(sdk.glob("*.c"))]
        ctx.log(
            f"c: compiling {len(units)} files ({len(own)} of the bundle, {len(units) - len(own)} of the SDK) for linux/{arch}"
        )

        ctx.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=ctx.cache_dir, prefix="c-build-") as scratch:
            objects: list[str] = []
            for i, (path, root, mapped) in enumerate(units):
                obj = os.path.join(scratch, f"{i:04d}.o")
                name = str(PurePosixPath(mapped) / path.relative_to(root).as_posix())
                _compile(
                    bundle,
                    [
                        COMPILER,
                        *CFLAGS,
                        f"-ffile-prefix-map={source}=.",
                        f"-ffile-prefix-map={sdk}=sdk/c",
                        f"-frandom-seed={name}",  # names gcc would otherwise randomise
                        f"-I{sdk}",
                        f"-I{source}",
                        "-c",
                        str(path),
                        "-o",
                        obj,
                    ],
                )
                objects.append(obj)
            output.parent.mkdir(parents=True, exist_ok=True)
            _compile(bundle, [COMPILER, *LDFLAGS, "-o", str(output), *objects, *LIBS])
        output.chmod(0o755)
        return BuildOutput(os="linux", arch=arch)


def _sdk_dir(ctx: BuildContext) -> Path:
    sdk = (ctx.repo_root / "sdk" / "c").resolve() if ctx.repo_root else None
    if sdk is None or not (sdk / "mesh.h").is_file():
        where = f"{sdk}" if sdk else "no project checkout was given (repo_root)"
        raise BuildFailed("c", ctx.bundle.name, [], f"the mesh C SDK (sdk/c/mesh.h) is not found: {where}")
    return sdk


def _entry_path(ctx: BuildContext) -> Path:
    """Where the binary goes: entry[0], which must stay inside the bundle."""
    entry = ctx.bundle.entry[0] if ctx.bundle.entry else ""
    rel = PurePosixPath(entry)
    if not entry or rel.is_absolute() or ".." in rel.parts or rel.name in ("", "."):
        raise BuildFailed(
            "c",
            ctx.bundle.name,
            [],
            f'entry[0] {entry!r} must name the binary by a path inside the bundle, e.g. "bin/{ctx.module.module.name}"',
        )
    return ctx.stage_dir / rel


def _arch(bundle: str) -> str:
    """The target of the compiler, not of the Python running this: they differ when cross-compiling."""
    triple = _run_quiet([COMPILER, "-dumpmachine"]).stdout.strip()  # e.g. x86_64-linux-gnu
    cpu = triple.split("-", 1)[0]
    if cpu not in ARCHES or "linux" not in triple:
        raise BuildFailed(
            "c",
            bundle,
            [COMPILER, "-dumpmachine"],
            f"gcc targets {triple!r}; bundles are built for linux on {', '.join(ARCHES)}",
        )
    return ARCHES[cpu]


def _env() -> dict[str, str]:
    # A fixed clock for __DATE__/__TIME__ and untranslated messages: same input, same bytes and output.
    env = dict(os.environ, LC_ALL="C")
    env.setdefault("SOURCE_DATE_EPOCH", "0")
    return env


def _run_quiet(cmd: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=_env(), timeout=60)
    except FileNotFoundError:
        raise ToolchainMissing("c", cmd[0], f"apt-get install {COMPILER}") from None


def _compile(bundle: str, cmd: list[str]) -> None:
    run_tool("c", bundle, cmd, cwd=None, env=_env(), timeout_s=TIMEOUT_S, install=f"apt-get install {COMPILER}")


TOOLCHAIN = CToolchain()
