"""The TypeScript SDK, the TypeScript toolchain and the hello-typescript bundle, end to end over real stdio.

Builds hello-typescript twice with `toolchains.typescript` (the staged bytes must match, and the
stage must hold no links), runs `node dist/main.js` in the stage as the runtime would (cwd =
bundle folder, MESH_* environment) and drives it with the test stdio client. Needs node and npm
(and the npm registry or a warm npm cache: scripts/setup-typescript.sh); without node every test
here is skipped with the reason shown.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.bus_contract import check_progress_and_cancel_over_the_bus
from tests.support.call_contract import CallContractTests, Wire, serving
from tests.support.sdk import build_context, facts_env, file_tree, require
from tests.support.stdio_client import PROTOCOL_VERSION, StdioClient
from toolchains.base import BuildFailed, BuildOutput, ToolchainMissing
from toolchains.typescript import TOOLCHAIN

REPO = Path(__file__).resolve().parent.parent
MODULE_DIR = REPO / "bundles" / "hello-typescript"
SDK_DIR = REPO / "sdk" / "typescript"
# Kept between runs (gitignored): the scratch builds live here; npm's own cache holds the packages.
CACHE = REPO / ".cache" / "toolchains" / "typescript"

pytestmark = [pytest.mark.slow, pytest.mark.toolchain("typescript")]


def _links(root: Path) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):  # os.walk does not follow links to folders, but lists them
        found += [os.path.join(folder, n) for n in dirs + files if os.path.islink(os.path.join(folder, n))]
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildOutput, Path]:
    """hello-typescript built twice into two stages; returns (first stage, its output, second stage)."""
    require(TOOLCHAIN)
    base = tmp_path_factory.mktemp("ts-build")
    out1 = TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage1", CACHE))
    out2 = TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage2", CACHE))
    assert out1 == out2
    return base / "stage1", out1, base / "stage2"


def _env(stage: Path, data_dir: Path) -> dict[str, str]:
    return facts_env("hello-typescript", stage, data_dir)


@pytest.fixture
def child(built: tuple[Path, BuildOutput, Path], tmp_path: Path) -> Iterator[StdioClient]:
    stage = built[0]
    client = StdioClient(["node", "dist/main.js"], cwd=stage, env=_env(stage, tmp_path / "data" / "hello-typescript"))
    yield client
    client.close()


def test_build_is_reproducible_and_staged(built: tuple[Path, BuildOutput, Path]) -> None:
    stage1, out, stage2 = built
    tree1, tree2 = file_tree(stage1), file_tree(stage2)
    assert list(tree1) == ["dist/main.js", "package.json"], "one packed script and its format, nothing else"
    assert tree1 == tree2, "two builds of the same source differ"
    assert _links(stage1) == [], "a bundle must hold no links"
    script = tree1["dist/main.js"][0]
    for path in (str(REPO), str(CACHE), "/tmp/"):
        assert path.encode() not in script, f"an absolute build path ({path}) is baked into the bundle"
    assert json.loads(tree1["package.json"][0])["type"] == "module"
    assert out == BuildOutput(), "JavaScript runs anywhere node does: no os, arch or extra env"
    print(f"\nstaged dist/main.js: {len(script)} bytes")


def test_initialize_list_and_call(child: StdioClient, tmp_path: Path) -> None:
    started = time.monotonic()
    init = child.initialize()
    print(f"\nfirst initialize reply after {(time.monotonic() - started) * 1000:.0f} ms")
    assert init["protocolVersion"] == PROTOCOL_VERSION
    assert init["serverInfo"]["name"] == "hello-typescript"
    assert (tmp_path / "data" / "hello-typescript").is_dir(), "facts() did not create MESH_DATA_DIR"

    tools = {t["name"]: t for t in child.list_tools()}
    assert set(tools) == {"greet"}
    schema = tools["greet"]["inputSchema"]
    assert schema["type"] == "object" and schema["required"] == ["name"]
    assert schema["properties"]["name"]["type"] == "string"
    assert tools["greet"]["outputSchema"]["properties"]["greeting"]["type"] == "string"

    greeting = child.call("greet", {"name": "Ada"})
    assert greeting["content"] == [{"type": "text", "text": "Hello, Ada! (typescript)"}]
    assert greeting["structuredContent"] == {"greeting": "Hello, Ada! (typescript)"}
    assert not greeting.get("isError")

    bad = child.call("greet", {})  # missing a required argument: a tool error, not a protocol one
    assert bad["isError"] is True

    assert child.request("ping") == {}
    assert child.close() == 0, "closing stdin must end the child cleanly"


def test_many_calls_in_flight(child: StdioClient) -> None:
    child.initialize()
    # all 20 written before a single reply is read
    results = child.calls_in_flight({1000 + i: ("greet", {"name": f"n{i}"}) for i in range(20)}, timeout=10)
    for i in range(20):
        result = results[1000 + i]
        assert not result.get("isError"), result
        assert result["structuredContent"] == {"greeting": f"Hello, n{i}! (typescript)"}


def test_without_facts_says_so_in_one_line(built: tuple[Path, BuildOutput, Path]) -> None:
    stage = built[0]
    proc = subprocess.run(
        ["node", "dist/main.js"],
        cwd=stage,
        env={"PATH": os.environ["PATH"]},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "MESH_DATA_DIR" in proc.stderr and "    at " not in proc.stderr


@pytest.fixture(scope="module")
def sdk_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdk/typescript copied out of the checkout with its packages installed and dist/ built."""
    require(TOOLCHAIN)
    copy = tmp_path_factory.mktemp("ts-sdk") / "sdk"
    shutil.copytree(SDK_DIR, copy, ignore=shutil.ignore_patterns("node_modules", "dist"))
    for command in (
        ["npm", "ci", "--ignore-scripts", "--prefer-offline", "--no-audit", "--no-fund"],
        ["npm", "run", "build"],
    ):
        proc = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return copy


def test_sdk_unit_tests(sdk_copy: Path) -> None:
    """`npm test` of sdk/typescript: names, facts, results, callers, progress, slow calls not blocking fast ones."""
    proc = subprocess.run(["npm", "test"], cwd=sdk_copy, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def contract(sdk_copy: Path) -> Iterator[Wire]:
    """The SDK's own fixture bundle (fixtures/stdio-server.mjs) over real stdio, initialized."""
    with serving(["node", "fixtures/stdio-server.mjs"], cwd=sdk_copy) as wire:
        yield wire


class TestCallContract(CallContractTests):
    """Caller, cancellation (extra.signal) and progress, as tests/support/call_contract.py checks them."""


def test_missing_node_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainMissing) as e:
        TOOLCHAIN.check()
    assert e.value.tool == "node" and "nodejs.org" in str(e.value)


def _broken_module(root: Path, main_ts: str) -> Path:
    """A module outside the checkout that uses the SDK by the same relative path as the repo's bundles."""
    shutil.copytree(SDK_DIR, root / "sdk" / "typescript", ignore=shutil.ignore_patterns("node_modules", "dist"))
    module = root / "bundles" / "broken"
    shutil.copytree(MODULE_DIR / "src", module / "src", ignore=shutil.ignore_patterns("node_modules", "dist"))
    (module / "module.toml").write_text(
        'name = "broken"\nversion = "0.1.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        'language = "typescript"\nsource = "src"\nentry = ["node", "dist/main.js"]\n'
    )
    (module / "src" / "src" / "main.ts").write_text(main_ts)
    return module


def test_type_error_is_build_failed(tmp_path: Path) -> None:
    require(TOOLCHAIN)
    module = _broken_module(tmp_path / "checkout", 'const n: number = "not a number";\nexport { n };\n')
    with pytest.raises(BuildFailed) as e:
        TOOLCHAIN.build(build_context(module, tmp_path / "stage", CACHE, repo_root=None))
    assert "TS2322" in e.value.output and "main.ts" in e.value.output
    assert not (module / "src" / "node_modules").exists(), "the build wrote into the source tree"


def test_missing_lock_file_is_named(tmp_path: Path) -> None:
    require(TOOLCHAIN)
    module = _broken_module(tmp_path / "checkout", "export {};\n")
    (module / "src" / "package-lock.json").unlink()
    with pytest.raises(BuildFailed) as e:
        TOOLCHAIN.build(build_context(module, tmp_path / "stage", CACHE, repo_root=None))
    assert "package-lock.json" in e.value.output and "bundles/broken/src" in e.value.output


async def test_progress_and_cancel_over_the_bus_through_a_node(sdk_copy: Path, node_factory, tmp_path: Path) -> None:
    """docs/bus.md end to end: bus progress from progress(), a bus cancel aborts extra.signal."""
    await check_progress_and_cancel_over_the_bus(
        node_factory,
        tmp_path / "mods",
        ["node", str(sdk_copy / "fixtures" / "stdio-server.mjs")],
        tmp_path / "marker",
        read=[sdk_copy],  # the fixture imports the SDK's dist/ and node_modules/ beside it (the child is confined)
    )


def test_a_rebuild_keeps_the_installed_packages_but_not_old_sources(
    built: tuple[Path, BuildOutput, Path], tmp_path: Path
) -> None:
    # `built` ran twice on CACHE: the scratch for these packages holds their node_modules now.
    lines: list[str] = []
    ctx = dataclasses.replace(build_context(MODULE_DIR, tmp_path / "stage", CACHE), log=lines.append)
    [scratch] = [p for p in CACHE.glob("ts-shared-*") if p.is_dir() and (p / "bundles" / "hello-typescript").is_dir()]
    leftover = scratch / "bundles" / "hello-typescript" / "src" / "src" / "removed-since.ts"
    leftover.write_text("this file is not in the source any more: it must not be built\n")
    TOOLCHAIN.build(ctx)
    installs = [line for line in lines if line.startswith("npm ci in ")]
    assert installs and all(line.endswith(": installed already from this package-lock.json") for line in installs)
    assert not leftover.exists(), "a file of an earlier build's sources was left in the scratch"
    assert file_tree(tmp_path / "stage") == file_tree(built[0])
