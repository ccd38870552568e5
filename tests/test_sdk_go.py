"""The Go SDK, the Go toolchain and the hello-go bundle, end to end over real stdio.

Builds hello-go twice with `toolchains.go` (the bytes must match), runs the staged binary as
the runtime would (cwd = bundle folder, MESH_* environment) and drives it with the test
stdio client. Needs `go`; without it every test here is skipped with the reason shown.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.bus_contract import check_progress_and_cancel_over_the_bus
from tests.support.call_contract import CallContractTests, Wire, serving
from tests.support.sdk import build_context, facts_env, file_tree, require
from tests.support.stdio_client import PROTOCOL_VERSION, StdioClient
from toolchains.base import BuildFailed, BuildOutput, ToolchainMissing
from toolchains.go import TOOLCHAIN

REPO = Path(__file__).resolve().parent.parent
MODULE_DIR = REPO / "bundles" / "hello-go"
CALLS_DIR = REPO / "tests" / "children" / "go-calls"

pytestmark = [pytest.mark.slow, pytest.mark.toolchain("go")]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildOutput, Path]:
    """hello-go built twice into two stages; returns (first stage, its output, second stage)."""
    require(TOOLCHAIN)
    base = tmp_path_factory.mktemp("go-build")
    first = build_context(MODULE_DIR, base / "stage1", base / "cache")
    second = build_context(MODULE_DIR, base / "stage2", base / "cache")
    out1 = TOOLCHAIN.build(first)
    out2 = TOOLCHAIN.build(second)
    assert out1 == out2
    return first.stage_dir, out1, second.stage_dir


@pytest.fixture
def child(built: tuple[Path, BuildOutput, Path], tmp_path: Path) -> Iterator[StdioClient]:
    stage = built[0]
    env = facts_env("hello-go", stage, tmp_path / "data" / "hello-go")
    client = StdioClient([str(stage / "bin" / "hello-go")], cwd=stage, env=env)
    yield client
    client.close()


@pytest.fixture(scope="module")
def calls_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The go-calls fixture bundle (whoami, wait_cancel, count, confirm) built by the Go toolchain."""
    require(TOOLCHAIN)
    base = tmp_path_factory.mktemp("go-calls")
    TOOLCHAIN.build(build_context(CALLS_DIR, base / "stage", base / "cache"))
    return base / "stage"


@pytest.fixture
def contract(calls_stage: Path, tmp_path: Path) -> Iterator[Wire]:
    env = facts_env("go-calls", calls_stage, tmp_path / "data")
    with serving([str(calls_stage / "bin" / "go-calls")], cwd=calls_stage, env=env) as wire:
        yield wire


class TestCallContract(CallContractTests):
    """Caller (CallerFrom), cancellation (ctx.Done, and no reply), progress (Progress) and asking
    (Elicit), as tests/support/call_contract.py checks them for every SDK."""


def test_build_is_reproducible_and_staged(built: tuple[Path, BuildOutput, Path]) -> None:
    stage1, out, stage2 = built
    tree1, tree2 = file_tree(stage1), file_tree(stage2)
    assert list(tree1) == ["bin/hello-go"]
    assert tree1 == tree2, "two builds of the same source differ"
    binary = tree1["bin/hello-go"][0]
    assert binary[:4] == b"\x7fELF"
    assert tree1["bin/hello-go"][1] & 0o111, "the binary is not executable"
    assert str(REPO).encode() not in binary, "an absolute build path is baked into the binary"
    assert out.os == "linux" and out.arch in ("amd64", "arm64") and out.env == {}


def test_initialize_list_and_call(child: StdioClient, tmp_path: Path) -> None:
    init = child.initialize()
    assert init["protocolVersion"] == PROTOCOL_VERSION
    assert init["serverInfo"]["name"] == "hello-go"
    assert (tmp_path / "data" / "hello-go").is_dir(), "meshsdk.Facts() did not create MESH_DATA_DIR"

    tools = {t["name"]: t for t in child.list_tools()}
    assert set(tools) == {"greet", "clock.now"}
    assert tools["greet"]["inputSchema"]["type"] == "object"
    assert tools["greet"]["inputSchema"]["required"] == ["name"]
    assert tools["clock.now"]["inputSchema"]["type"] == "object"

    greeting = child.call("greet", {"name": "Ada"})
    assert greeting["content"] == [{"type": "text", "text": "Hello, Ada! (go)"}]
    assert greeting["structuredContent"] == {"greeting": "Hello, Ada! (go)"}
    assert not greeting.get("isError")

    now = child.call("clock.now", {})
    stamp = now["content"][0]["text"]
    assert now["structuredContent"] == {"now": stamp}
    assert time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")

    bad = child.call("greet", {})  # missing a required argument: a tool error, not a protocol one
    assert bad["isError"] is True

    assert child.request("ping") == {}
    assert child.close() == 0, "closing stdin must end the child cleanly"


def test_many_calls_in_flight(child: StdioClient) -> None:
    child.initialize()
    calls: dict[int, tuple[str, dict[str, Any]]] = {}
    for i in range(20):
        ident = 1000 + i
        calls[ident] = ("clock.now", {}) if i % 2 else ("greet", {"name": f"n{i}"})
    results = child.calls_in_flight(calls, timeout=10)
    for ident, (tool, arguments) in calls.items():
        result = results[ident]
        assert not result.get("isError"), result
        if tool == "greet":
            assert result["structuredContent"] == {"greeting": f"Hello, {arguments['name']}! (go)"}
        else:
            assert result["structuredContent"]["now"] == result["content"][0]["text"]


def test_sdk_unit_tests() -> None:
    """`go test` of sdk/go: seat-verb names, facts, typed tools, a slow call not blocking a fast
    one, the caller from _meta, progress, no reply to a cancelled call."""
    require(TOOLCHAIN)
    proc = subprocess.run(
        ["go", "test", "-count=1", "./..."], cwd=REPO / "sdk" / "go", capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_missing_go_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainMissing) as e:
        TOOLCHAIN.check()
    assert "go.dev/dl" in str(e.value)


def test_compile_error_is_build_failed(tmp_path: Path) -> None:
    require(TOOLCHAIN)
    module = tmp_path / "broken"
    (module / "src").mkdir(parents=True)
    (module / "module.toml").write_text(
        'name = "broken"\nversion = "0.1.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        'language = "go"\nsource = "src"\nentry = ["bin/broken"]\n'
    )
    (module / "src" / "go.mod").write_text("module broken\n\ngo 1.25.0\n")
    (module / "src" / "main.go").write_text("package main\n\nfunc main() { undefinedThing() }\n")
    with pytest.raises(BuildFailed) as e:
        TOOLCHAIN.build(build_context(module, tmp_path / "stage", tmp_path / "cache"))
    assert "undefinedThing" in e.value.output


async def test_progress_and_cancel_over_the_bus_through_a_node(calls_stage: Path, node_factory, tmp_path: Path) -> None:
    """docs/bus.md end to end: bus progress from Progress(ctx, ...), a bus cancel reaches ctx.Done()."""
    program = calls_stage / "bin" / "go-calls"
    await check_progress_and_cancel_over_the_bus(
        node_factory, tmp_path / "mods", [], tmp_path / "marker", program=program
    )
