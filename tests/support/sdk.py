"""What the SDK and toolchain tests of every language share: a build context, a staged tree, a
toolchain that must be there (or the test says why it cannot run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifests import load_module
from toolchains.base import BuildContext, Toolchain, ToolchainMissing

REPO = Path(__file__).resolve().parents[2]


def require(toolchain: Toolchain) -> None:
    """Skip, with the reason printed, when the toolchain's compiler is not installed."""
    try:
        toolchain.check()
    except ToolchainMissing as e:
        print(f"SKIPPED: {e}")
        pytest.skip(str(e))


def build_context(module_dir: Path, stage: Path, cache: Path, repo_root: Path | None = REPO) -> BuildContext:
    """The context of the module's first tools bundle, staged into a new folder `stage`."""
    loaded = load_module(module_dir)
    bundle = loaded.module.tools_bundles()[0]
    stage.mkdir(parents=True)
    return BuildContext(
        module=loaded,
        bundle=bundle,
        source_dir=loaded.source_dir(bundle),
        stage_dir=stage,
        cache_dir=cache,
        repo_root=repo_root,
        log=lambda _: None,
    )


def file_tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root`: bytes and mode, by relative path (two builds compare equal)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode) for p in sorted(root.rglob("*")) if p.is_file()
    }


def facts_env(
    module: str, bundle_dir: Path, data_dir: Path, *, node: str = "test-node", **extra: str
) -> dict[str, str]:
    """The MESH_* facts the node gives a tools bundle's child, for a child a test starts by hand."""
    return {
        "MESH_NODE": node,
        "MESH_MODULE": module,
        "MESH_BUNDLE": "tools",
        "MESH_BUNDLE_DIR": str(bundle_dir),
        "MESH_DATA_DIR": str(data_dir),
        **extra,
    }
