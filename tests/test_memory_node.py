"""The memory module behind a real node on a real nats-server: built from source, served on
`mesh.seat.memory.<verb>`, and its data still there after the child is killed, after the
node restarts, and after an upgrade delivered with `meshctl bundle deliver`.

The node does not pass callers over the bus yet (issue 10 adds `_meta["mesh/caller"]`), so
the entries here are written by the store in-process into the node's data folder for the
module, and the bus calls read them as a caller-less call does: shared scopes only.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, call, client, status, wait_state
from toolchains.artifact import pack, verify_and_unpack
from toolchains.build import build_module

SRC = ROOT / "bundles" / "memory" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from memory.config import Config, Project  # noqa: E402
from memory.model import Writer  # noqa: E402
from memory.store import Store  # noqa: E402

# A Python SDK child imports `mcp` (~0.6 s, more on a busy machine): give it time.
SDK_CONFIG = FAST_CONFIG.replace("init_timeout_s = 2", "init_timeout_s = 20")
ALICE = Writer(id="ALICE/alice", account="ALICE", via="bus")


def seed(data_dir: Path) -> tuple[int, int]:
    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(data_dir, Config(projects=(Project("billing", "Billing"),)))
    try:
        shared = store.remember(ALICE, "Postgres is the system of record.", "decision", "db.system-of-record")
        secret = store.remember(ALICE, "Alice's private note.", "status", scope="private")
    finally:
        store.close()
    return shared["id"], secret["id"]


async def recall_ids(nc, **args) -> list[int]:
    code, body = await call(nc, "mesh.seat.memory.recall", args, timeout=20)
    assert code == 200 and body["isError"] is False, body
    return [e["id"] for e in body["structuredContent"]["entries"]]


def test_memory_is_served_and_its_data_survives_child_kill_and_node_restart(tmp_path: Path, node_factory) -> None:
    mods = tmp_path / "mods"
    shutil.copytree(ROOT / "bundles" / "memory", mods / "memory", ignore=shutil.ignore_patterns("__pycache__"))
    node = node_factory(mods, name="memory-node", config=SDK_CONFIG)
    data_dir = node.state_dir / "data" / "memory"
    shared, secret = seed(data_dir)

    async def first_life() -> None:
        nc = await client(node.bus_url())
        try:
            ready = await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)
            assert sorted(ready["tools"]) == sorted(
                f"memory.{v}"
                for v in ("archive_scope", "create_scope", "forget", "load_context", "recall", "remember", "scopes")
            )
            assert await recall_ids(nc) == [shared]  # the private entry is nobody else's business
            assert await recall_ids(nc, query="postgres") == [shared]
            code, body = await call(nc, "mesh.seat.memory.scopes", {}, timeout=20)
            slugs = [s["slug"] for s in body["structuredContent"]["scopes"]]
            # "private" only once the node stamps a caller on bus calls: then it is that caller's own.
            assert code == 200 and slugs[:2] == ["global", "billing"] and set(slugs[2:]) <= {"private"}
            code, body = await call(nc, "mesh.seat.memory.recall", {"limit": "ten"}, timeout=20)
            assert code == 400  # the node checks arguments against the verb's input schema
            code, body = await call(nc, "mesh.seat.memory.recall", {"query": "***"}, timeout=20)
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
            assert await recall_ids(nc, key="db.system-of-record") == [shared]
        finally:
            await nc.close()

    asyncio.run(first_life())
    assert node.terminate() == 0
    restarted = node_factory(mods, name="memory-node", config=SDK_CONFIG)
    assert restarted.state_dir == node.state_dir

    async def second_life() -> None:
        nc = await client(restarted.bus_url())
        try:
            await wait_state(nc, restarted.name, "memory/tools", "ready", timeout=60)
            assert await recall_ids(nc) == [shared]
        finally:
            await nc.close()

    asyncio.run(second_life())
    store = Store(data_dir, Config())  # and the private entry is still its owner's
    try:
        assert [e["id"] for e in store.recall(ALICE, scope="private")] == [secret]
    finally:
        store.close()


def upgraded(artifact: Path, out: Path, version: str) -> Path:
    """The same bundle as a new version: unpacked, its version changed, packed by the project's packer."""
    stage = out / f"stage-{version}-{artifact.name}"
    meta = verify_and_unpack(artifact, stage)
    manifest = meta.manifest.replace(f'version = "{meta.version}"', f'version = "{version}"', 1)
    return pack(stage, msgspec.structs.replace(meta, version=version, manifest=manifest), out)


async def module_version(nc, node: str) -> str | None:
    return next((m["version"] for m in (await status(nc, node))["modules"] if m["name"] == "memory"), None)


@pytest.mark.slow
def test_memory_data_survives_an_upgrade_delivered_by_meshctl(tmp_path: Path, node_factory, nats_server) -> None:
    out = tmp_path / "out"
    cache = Path(os.environ.get("MESH_TOOLCHAIN_CACHE", ROOT / ".cache" / "toolchains"))
    # Two bundles: the schema migration (a step) and the tools.
    v1 = build_module(ROOT / "bundles" / "memory", out, cache_dir=cache, progress=lambda _: None)
    assert len(v1) == 2
    v2 = [upgraded(a, out, "0.2.0") for a in v1]
    empty = tmp_path / "none"
    empty.mkdir()
    node = node_factory(empty, config=SDK_CONFIG)

    def deliver(artifacts: list[Path]) -> None:
        r = subprocess.run(
            [*MESHCTL, "bundle", "deliver", *map(str, artifacts), "--node", node.name, "--nats", nats_server.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr

    async def until_version(nc, version: str) -> None:
        deadline = time.monotonic() + 90
        while await module_version(nc, node.name) != version:
            assert time.monotonic() < deadline, f"memory {version} never came up: {await status(nc, node.name)}"
            await asyncio.sleep(0.2)
        await wait_state(nc, node.name, "memory/tools", "ready", timeout=60)

    async def run() -> None:
        nc = await client(nats_server.url)
        try:
            deliver(v1)
            await until_version(nc, "0.1.0")
            shared, _ = seed(node.state_dir / "data" / "memory")
            assert await recall_ids(nc) == [shared]
            pid = (await wait_state(nc, node.name, "memory/tools", "ready"))["pid"]
            deliver(v2)
            await until_version(nc, "0.2.0")
            # The migration ran as a step once per version, before the tools: recorded, and logged.
            steps = node.state_dir / "steps" / "memory"
            assert sorted(p.name for p in steps.iterdir()) == ["migrate@0.1.0.json", "migrate@0.2.0.json"]
            assert "schema 0 -> 2" in node.log() and "is at schema 2 already" in node.log()
            assert (await wait_state(nc, node.name, "memory/tools", "ready"))["pid"] != pid  # a new child
            assert await recall_ids(nc, query="postgres") == [shared]
        finally:
            await nc.close()

    asyncio.run(run())
