"""The memory module behind a real node on a real nats-server with two caller accounts: built
from source, served on `mesh.seat.memory.<verb>`, and its data (alice's shared entry and her
private one, still hers alone) there after the child is killed, after the node restarts, and
after an upgrade delivered with `meshctl bundle deliver`. What the members may see and write is
tests/test_memory_bus.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from tests.faults.security_support import ConfiguredServer
from tests.support.callers import MESH_PASSWORD, MESH_USER, callers_node, callers_server, connect_as
from tests.support.mesh import MESHCTL, ROOT, call, status, wait_state
from toolchains.artifact import pack, verify_and_unpack
from toolchains.build import build_module

VERBS = ("archive_scope", "create_scope", "forget", "load_context", "recall", "remember", "scopes")


async def remembered(nc: Client, **args: Any) -> int:
    code, body = await call(nc, "mesh.seat.memory.remember", args, timeout=20)
    assert code == 200 and body["isError"] is False, body
    return body["structuredContent"]["id"]


async def seed(server: ConfiguredServer) -> tuple[int, int]:
    """alice writes a shared decision and a private note, over the bus."""
    alice = await connect_as(server, "alice")
    try:
        shared = await remembered(alice, content="Postgres is the system of record.", type="decision", key="db.sor")
        secret = await remembered(alice, content="Alice's private note.", type="status", scope="private")
    finally:
        await alice.close()
    return shared, secret


async def recall_ids(nc: Client, **args: Any) -> list[int]:
    code, body = await call(nc, "mesh.seat.memory.recall", args, timeout=20)
    assert code == 200 and body["isError"] is False, body
    return [e["id"] for e in body["structuredContent"]["entries"]]


async def seen_by(server: ConfiguredServer, **args: Any) -> dict[str, list[int]]:
    """What alice and bob each recall with these arguments."""
    seen = {}
    for who in ("alice", "bob"):
        nc = await connect_as(server, who)
        try:
            seen[who] = await recall_ids(nc, **args)
        finally:
            await nc.close()
    return seen


@pytest.fixture
def bus(tmp_path: Path) -> Any:
    server = callers_server(tmp_path / "bus")
    yield server
    server.stop()


def test_memory_is_served_and_its_data_survives_child_kill_and_node_restart(
    tmp_path: Path, bus: ConfiguredServer
) -> None:
    mods = tmp_path / "mods"
    shutil.copytree(ROOT / "bundles" / "memory", mods / "memory", ignore=shutil.ignore_patterns("__pycache__"))
    node = callers_node(tmp_path, bus, mods, "memory-node", init_timeout_s=20)

    async def first_life() -> tuple[int, int]:
        nc = await connect_as(bus, None)
        try:
            ready = await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)
            assert sorted(ready["tools"]) == sorted(f"memory.{v}" for v in VERBS)
            shared, secret = await seed(bus)
            assert await seen_by(bus) == {"alice": [secret, shared], "bob": [shared]}
            alice = await connect_as(bus, "alice")  # calls come from callers: the mesh account may not publish one
            code, body = await call(alice, "mesh.seat.memory.recall", {"limit": "ten"}, timeout=20)
            assert code == 400  # the node checks arguments against the verb's input schema
            code, body = await call(alice, "mesh.seat.memory.recall", {"query": "***"}, timeout=20)
            await alice.close()
            assert code == 200 and body["isError"] is True  # a refusal is the tool's answer, not a runtime error
            assert "no words to search for" in body["content"][0]["text"]
            # The child dies hard; the node restarts it on the same data.
            os.kill(ready["pid"], signal.SIGKILL)
            again = await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)
            deadline = asyncio.get_running_loop().time() + 60
            while again["pid"] == ready["pid"] or again["restarts"] < 1:
                assert asyncio.get_running_loop().time() < deadline, again
                await asyncio.sleep(0.1)
                again = await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)
            assert await seen_by(bus, key="db.sor") == {"alice": [shared], "bob": [shared]}
            assert await seen_by(bus, scope="private") == {"alice": [secret], "bob": []}
            return shared, secret
        finally:
            await nc.close()

    try:
        shared, secret = asyncio.run(first_life())
        assert node.terminate() == 0
    finally:
        node.kill()
    restarted = callers_node(tmp_path, bus, mods, "memory-node", init_timeout_s=20)
    assert restarted.state_dir == node.state_dir

    async def second_life() -> None:
        nc = await connect_as(bus, None)
        try:
            await wait_state(nc, restarted.name, "memory/tools", "ready", timeout=60)
            # The private entry is still its owner's, and still nobody else's.
            assert await seen_by(bus) == {"alice": [secret, shared], "bob": [shared]}
        finally:
            await nc.close()

    try:
        asyncio.run(second_life())
    finally:
        restarted.kill()


def upgraded(artifact: Path, out: Path, version: str) -> Path:
    """The same bundle as a new version: unpacked, its version changed, packed by the project's packer."""
    stage = out / f"stage-{version}-{artifact.name}"
    meta = verify_and_unpack(artifact, stage)
    manifest = meta.manifest.replace(f'version = "{meta.version}"', f'version = "{version}"', 1)
    return pack(stage, msgspec.structs.replace(meta, version=version, manifest=manifest), out)


async def module_version(nc: Client, node: str) -> str | None:
    return next((m["version"] for m in (await status(nc, node))["modules"] if m["name"] == "memory"), None)


@pytest.mark.slow
def test_memory_data_survives_an_upgrade_delivered_by_meshctl(tmp_path: Path, bus: ConfiguredServer) -> None:
    out = tmp_path / "out"
    cache = Path(os.environ.get("MESH_TOOLCHAIN_CACHE", ROOT / ".cache" / "toolchains"))
    # Two bundles: the schema migration (a step) and the tools.
    v1 = build_module(ROOT / "bundles" / "memory", out, cache_dir=cache, progress=lambda _: None)
    assert len(v1) == 2
    v2 = [upgraded(a, out, "0.2.0") for a in v1]
    empty = tmp_path / "none"
    empty.mkdir()
    node = callers_node(tmp_path, bus, empty, "memory-upgrade", init_timeout_s=20)

    def deliver(artifacts: list[Path]) -> None:
        r = subprocess.run(
            [*MESHCTL, "bundle", "deliver", *map(str, artifacts), "--node", node.name, "--nats", bus.url]
            + ["--user", MESH_USER, "--password", MESH_PASSWORD],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr

    async def until_version(nc: Client, version: str) -> None:
        deadline = time.monotonic() + 90
        while await module_version(nc, node.name) != version:
            assert time.monotonic() < deadline, f"memory {version} never came up: {await status(nc, node.name)}"
            await asyncio.sleep(0.2)
        await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)

    async def run() -> None:
        nc = await connect_as(bus, None)
        try:
            deliver(v1)
            await until_version(nc, "0.1.0")
            shared, secret = await seed(bus)
            pid = (await wait_state(nc, node.name, "memory/tools", "ready"))["pid"]
            deliver(v2)
            await until_version(nc, "0.2.0")
            # The migration ran as a step once per version, before the tools: recorded, and logged.
            steps = node.state_dir / "steps" / "memory"
            assert sorted(p.name for p in steps.iterdir()) == ["migrate@0.1.0.json", "migrate@0.2.0.json"]
            assert "schema 0 -> 2" in node.log() and "is at schema 2 already" in node.log()
            assert (await wait_state(nc, node.name, "memory/tools", "ready"))["pid"] != pid  # a new child
            assert await seen_by(bus, query="postgres") == {"alice": [shared], "bob": [shared]}
            assert await seen_by(bus, scope="private") == {"alice": [secret], "bob": []}
        finally:
            await nc.close()

    try:
        asyncio.run(run())
    finally:
        node.kill()
