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
from tests.support.mesh import MESHCTL, ROOT, NodeProcess, call, status, wait_state
from toolchains.build import build_module
from toolchains.pack import pack
from toolchains.verify import verify_and_unpack

VERBS = (
    "archive_scope",
    "create_scope",
    "forget",
    "history",
    "load_context",
    "purge",
    "recall",
    "remember",
    "rename_scope",
    "restore",
    "scopes",
    "unarchive_scope",
)


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


def deliver(node: NodeProcess, bus: ConfiguredServer, artifacts: list[Path]) -> None:
    r = subprocess.run(
        [*MESHCTL, "bundle", "deliver", *map(str, artifacts), "--node", node.name, "--nats", bus.url]
        + ["--user", MESH_USER, "--password", MESH_PASSWORD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


async def until_version(nc: Client, node: NodeProcess, version: str) -> None:
    deadline = time.monotonic() + 90
    while await module_version(nc, node.name) != version:
        assert time.monotonic() < deadline, f"memory {version} never came up: {await status(nc, node.name)}"
        await asyncio.sleep(0.2)
    await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)


def toolchain_cache() -> Path:
    return Path(os.environ.get("MESH_TOOLCHAIN_CACHE", ROOT / ".cache" / "toolchains"))


@pytest.mark.slow
def test_memory_data_survives_an_upgrade_delivered_by_meshctl(tmp_path: Path, bus: ConfiguredServer) -> None:
    out = tmp_path / "out"
    # Two bundles: the schema migration (a step) and the tools.
    v1 = build_module(ROOT / "bundles" / "memory", out, cache_dir=toolchain_cache(), progress=lambda _: None)
    assert len(v1) == 2
    v2 = [upgraded(a, out, "0.3.0") for a in v1]
    empty = tmp_path / "none"
    empty.mkdir()
    node = callers_node(tmp_path, bus, empty, "memory-upgrade", init_timeout_s=20)

    async def run() -> None:
        nc = await connect_as(bus, None)
        try:
            deliver(node, bus, v1)
            await until_version(nc, node, "0.2.0")
            shared, secret = await seed(bus)
            pid = (await wait_state(nc, node.name, "memory/tools", "ready"))["pid"]
            deliver(node, bus, v2)
            await until_version(nc, node, "0.3.0")
            # The migration ran as a step once per version, before the tools: recorded, and logged.
            steps = node.state_dir / "steps" / "memory"
            assert sorted(p.name for p in steps.iterdir()) == ["migrate@0.2.0.json", "migrate@0.3.0.json"]
            assert "schema 0 -> 3" in node.log() and "is at schema 3 already" in node.log()
            assert (await wait_state(nc, node.name, "memory/tools", "ready"))["pid"] != pid  # a new child
            assert await seen_by(bus, query="postgres") == {"alice": [shared], "bob": [shared]}
            assert await seen_by(bus, scope="private") == {"alice": [secret], "bob": []}
        finally:
            await nc.close()

    try:
        asyncio.run(run())
    finally:
        node.kill()


def released_module(out: Path) -> Path:
    """bundles/memory as release 0.1.0 (schema 2, before history) left it, from this checkout's history:
    the parent of the first commit whose schema holds schema 3."""
    git = ["git", "-C", str(ROOT)]
    found = subprocess.run(
        [*git, "log", "--reverse", "--format=%H", "-S", "_schema_3", "--", "bundles/memory/src/memory/schema.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not found:
        pytest.fail("this checkout's git history does not hold memory 0.1.0 (a shallow clone?): fetch its history")
    bump = found[0]
    archive = subprocess.run([*git, "archive", f"{bump}^", "bundles/memory"], capture_output=True, check=True)
    out.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    module = out / "bundles" / "memory"
    assert 'version = "0.1.0"' in (module / "module.toml").read_text()
    assert "_schema_3" not in (module / "src" / "memory" / "schema.py").read_text()
    return module


@pytest.mark.slow
def test_a_store_of_release_0_1_0_upgrades_with_its_data(tmp_path: Path, bus: ConfiguredServer) -> None:
    out = tmp_path / "out"
    old = build_module(
        released_module(tmp_path / "released"), out, cache_dir=toolchain_cache(), progress=lambda _: None
    )
    new = build_module(ROOT / "bundles" / "memory", out, cache_dir=toolchain_cache(), progress=lambda _: None)
    empty = tmp_path / "none"
    empty.mkdir()
    node = callers_node(tmp_path, bus, empty, "memory-release", init_timeout_s=20)

    async def run() -> None:
        nc = await connect_as(bus, None)
        bob = await connect_as(bus, "bob")
        try:
            deliver(node, bus, old)
            await until_version(nc, node, "0.1.0")
            shared, secret = await seed(bus)
            await remembered(bob, content="Postgres 16 is the system of record.", type="decision", key="db.sor")
            deliver(node, bus, new)
            await until_version(nc, node, "0.2.0")
            assert "schema 2 -> 3" in node.log()  # the step, on the file release 0.1.0 wrote
            ready = await wait_state(nc, node.name, "memory/tools", "ready")
            assert sorted(ready["tools"]) == sorted(f"memory.{v}" for v in VERBS)
            # The data: the same ids, the private entry still alice's alone; found by a stem now.
            assert await seen_by(bus, query="records") == {"alice": [shared], "bob": [shared]}
            assert await seen_by(bus, scope="private") == {"alice": [secret], "bob": []}
            # Its history begins with it as it read (bob's upsert of 0.1.0 left no trace to import).
            code, body = await call(bob, "mesh.seat.memory.history", {"id": shared}, timeout=20)
            assert code == 200 and body["isError"] is False, body
            [first] = body["structuredContent"]["versions"]
            assert (first["action"], first["by"], first["content"]) == (
                "import",
                "bob/bob",
                "Postgres 16 is the system of record.",
            )
            # And goes on: a change now is version 2, with the text before it.
            await remembered(bob, content="Postgres 17 is the system of record.", type="decision", key="db.sor")
            code, body = await call(bob, "mesh.seat.memory.history", {"id": shared}, timeout=20)
            latest = body["structuredContent"]["versions"][0]
            assert (latest["version"], latest["before"]) == (2, "Postgres 16 is the system of record.")
        finally:
            await bob.close()
            await nc.close()

    try:
        asyncio.run(run())
    finally:
        node.kill()
