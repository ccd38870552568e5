"""What each child of the node may reach: its `Confinement` (launcher/sandbox.py), by default.

Every child the node starts (tools, service, step; first-party, imported, delivered; every
language) gets one from `confinement_of`: its bundle folder to read and execute, its module's
data folder and a private temporary folder to write, the system's runtime paths and its own
interpreter's; the manifest's `read`, `write`, `network` and limits. Never the node's state
folder (bus.json, passwords, the bus's store, other modules' data), its config, other bundles.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import anyio.to_thread

from launcher import sandbox
from launcher.sandbox import Confinement, Endpoint, Limits
from manifests import BundleManifest
from runtime.config import NodeConfig
from runtime.hosting.placement import data_dir

log = logging.getLogger("mesh.node")

# How deep `linked_out` looks for links that leave a bundle folder (a build's node_modules
# entries, a vendored package linked from a cache): two levels, never a whole tree.
LINK_DEPTH = 2
MAX_LINKED = 32  # read paths added for links; past it the rest are not followed (said once)


def tmp_dir(state_dir: Path | str, module: str, bundle: str) -> Path:
    """A child's private temporary folder (its TMPDIR): <state>/tmp/<module>.<bundle>."""
    return Path(state_dir) / "tmp" / f"{module}.{bundle}"


def made_tmp_root(state_dir: Path | str, child_user: str | None) -> None:
    """<state>/tmp, which a `child_user` passes through to its own folder (0711), else 0700."""
    root = Path(state_dir) / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711 if child_user else 0o700)


def confinement_of(
    spec: BundleManifest, module: str, bundle_dir: Path | str, argv: list[str], config: NodeConfig
) -> Confinement:
    """The confinement of one bundle's child run from `bundle_dir` with `argv`."""
    made_tmp_root(config.state_dir, config.child_user)
    defaults = Limits()
    limits = Limits(
        max_memory_mb=spec.max_memory_mb or defaults.max_memory_mb,
        max_processes=spec.max_processes or defaults.max_processes,
        max_open_files=spec.max_open_files or defaults.max_open_files,
    )
    folder = str(Path(bundle_dir).absolute())
    return Confinement(
        bundle_dir=folder,
        data_dir=str(data_dir(config.state_dir, module)),
        tmp_dir=str(tmp_dir(config.state_dir, module, spec.name)),
        read=tuple(spec.read),
        write=tuple(spec.write),
        runtime=runtime_paths(argv, folder),
        network=tuple(Endpoint(host, port) for host, port in spec.endpoints()),
        limits=limits,
        required=config.sandbox.required,
    )


def moved(confinement: Confinement, bundle_dir: Path | str, argv: list[str]) -> Confinement:
    """The same confinement for the child run from another folder (a build's, from source)."""
    folder = str(Path(bundle_dir).absolute())
    return Confinement(
        bundle_dir=folder,
        data_dir=confinement.data_dir,
        tmp_dir=confinement.tmp_dir,
        read=confinement.read,
        write=confinement.write,
        runtime=runtime_paths(argv, folder),
        network=confinement.network,
        limits=confinement.limits,
        required=confinement.required,
    )


def runtime_paths(argv: list[str], bundle_dir: str) -> tuple[str, ...]:
    """Read paths the child's program needs beyond the system's and its bundle folder: its
    interpreter's install (`sandbox.program_paths`) and where the folder's links lead."""
    found = list(sandbox.program_paths(argv[0])) if argv else []
    found += linked_out(bundle_dir)
    return tuple(dict.fromkeys(found))


def linked_out(bundle_dir: str) -> list[str]:
    """The targets of symbolic links near the top of `bundle_dir` that lead out of it: Landlock
    judges the path a link resolves to, so a link into a cache is unreadable unless named."""
    real_root = os.path.realpath(bundle_dir)
    out: list[str] = []
    level = [bundle_dir]
    for _ in range(LINK_DEPTH):
        below: list[str] = []
        for folder in level:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _beneath(target, real_root) and os.path.exists(target):
                        out.append(target)
                elif entry.is_dir(follow_symlinks=False):
                    below.append(entry.path)
        level = below
        if len(out) >= MAX_LINKED:
            log.warning(
                "bundle folder %s: more than %d links lead out of it; the rest stay unreadable", bundle_dir, MAX_LINKED
            )
            return out[:MAX_LINKED]
    return out


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


async def node_sandbox(config: NodeConfig) -> str:
    """What this node's children are confined with, in one line for status, asked once at the
    start (the helper's probe, maybe its build). Said once: a WARNING when the machine lacks
    Landlock and `[sandbox] required = false` lets children run without it; an ERROR when it is
    required (each bundle is then refused with the reason, and the node still serves)."""
    support = await anyio.to_thread.run_sync(sandbox.support, config.child_user, config.child_group)
    probe = Confinement(bundle_dir="/", data_dir="/", tmp_dir="/", required=config.sandbox.required)
    missing = support.missing(probe)
    line = sandbox.describe(probe, support).replace(" + netns", "").replace(" + no inet sockets", "")
    if not missing:
        return line
    if config.sandbox.required:
        log.error(
            "sandbox: %s; every bundle is refused until it is there (or set [sandbox] required = false "
            "in the node's config to run them unconfined)",
            "; ".join(missing),
        )
        return f"required, unavailable: {'; '.join(missing)}"
    log.warning(
        "sandbox: %s; bundles run without it ([sandbox] required = false): each can read and write what the "
        "node's user can",
        "; ".join(missing),
    )
    return f"not required, missing: {'; '.join(missing)} (bundles run without it)"
