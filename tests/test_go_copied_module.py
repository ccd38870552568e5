"""A Go module copied out of the checkout (a `bundles` folder of one's own) still builds.

Its go.mod keeps `replace mesh.local/sdk/go => ../../../sdk/go`, which points nowhere once the
folder is copied; the Go toolchain then builds it in a Go workspace whose replace points at this
checkout's SDK, and the node's source builds and `meshctl bundle build` find that checkout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.sdk import build_context, require
from toolchains.build import build_module, find_repo_root
from toolchains.go import TOOLCHAIN, sdk_workspace

REPO = Path(__file__).resolve().parent.parent


def copied(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / "bundles" / name
    shutil.copytree(REPO / "bundles" / name, dest)
    return dest


def test_a_folder_outside_the_checkout_finds_the_checkout_the_runtime_runs_from(tmp_path: Path) -> None:
    assert find_repo_root(tmp_path) == REPO


def test_the_module_in_the_checkout_builds_without_a_workspace(tmp_path: Path) -> None:
    ctx = build_context(REPO / "bundles" / "hello-go", tmp_path / "stage", tmp_path / "cache")
    assert sdk_workspace(ctx, tmp_path) is None


def test_a_copied_module_gets_a_workspace_naming_this_checkouts_sdk(tmp_path: Path) -> None:
    module = copied(tmp_path, "hello-go")
    ctx = build_context(module, tmp_path / "stage", tmp_path / "cache")
    found = sdk_workspace(ctx, tmp_path)
    assert found is not None
    work, sdk = found
    assert sdk == REPO / "sdk" / "go"
    text = work.read_text()
    assert f"use {ctx.source_dir.resolve()}" in text
    assert f"replace mesh.local/sdk/go => {sdk}" in text
    assert not (ctx.source_dir / "go.work").exists()  # the source folder is never written


@pytest.mark.slow
@pytest.mark.toolchain("go")
def test_a_copied_go_module_builds_into_an_artifact(tmp_path: Path) -> None:
    require(TOOLCHAIN)
    module = copied(tmp_path, "hello-go")
    lines: list[str] = []
    artifacts = build_module(module, tmp_path / "out", cache_dir=tmp_path / "cache", progress=lines.append)
    assert [a.name for a in artifacts] == ["hello-go-tools-0.1.0-linux-amd64.tar.gz"]
    assert any("is not beside this copy of the module" in line for line in lines), lines
    assert sorted(p.name for p in module.rglob("*")) == sorted(
        p.name for p in (REPO / "bundles" / "hello-go").rglob("*")
    )  # nothing written into the copy
