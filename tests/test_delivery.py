"""Delivery end to end: artifacts into JetStream, a node's membership in KV, the node reconciles."""

from __future__ import annotations

import asyncio
import gzip
import io
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.support.mesh import MESHCTL, RAW_CHILD, ROOT, call, client, status, wait_for, wait_state
from toolchains.artifact import ArtifactMeta
from toolchains.pack import pack

pytestmark = pytest.mark.slow


def raw_artifact(out: Path, module: str, version: str, *, seats: list[str] | None = None) -> Path:
    """A real artifact of a Python bundle (the raw test child), packed by the project's packer."""
    stage = out / f"stage-{module}-{version}"
    stage.mkdir(parents=True)
    shutil.copy(RAW_CHILD, stage / "raw_child.py")
    manifest = (
        f'name = "{module}"\nversion = "{version}"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        f'language = "python"\nsource = "src"\nentry = ["python", "raw_child.py"]\n'
        f'env = {{ RAW_VERSION = "{version}" }}\n'
    )
    for seat in seats or []:
        manifest += f'\n[[seat]]\nname = "{seat}"\n'
    meta = ArtifactMeta(
        module=module,
        bundle="tools",
        version=version,
        kind="tools",
        language="python",
        entry=["python", "raw_child.py"],
        manifest=manifest,
    )
    return pack(stage, meta, out)


def meshctl(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MESHCTL, *args, "--nats", url], cwd=ROOT, capture_output=True, text=True, timeout=60)


async def wait_call(nc, subject: str, args: dict, ok, timeout: float = 20):
    # Any error is "not yet": no responders while the module is not served yet.
    return await wait_for(
        lambda: call(nc, subject, args, timeout=5), f"{subject} answering as expected", timeout, 0.1, ok, (Exception,)
    )


async def test_deliver_upgrade_remove_redeliver(tmp_path: Path, node_factory, nats_server) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    node = node_factory(empty)
    nc = await client(nats_server.url)
    v1 = raw_artifact(tmp_path / "out", "store", "1.0.0", seats=["kv"])
    other = raw_artifact(tmp_path / "out", "other", "1.0.0")
    r = meshctl("bundle", "deliver", str(v1), str(other), "--node", node.name, url=nats_server.url)
    assert r.returncode == 0, r.stderr
    assert "uploaded" in r.stdout
    await wait_call(
        nc, "mesh.tool.store.version", {}, lambda r: r[0] == 200 and r[1]["structuredContent"]["version"] == "1.0.0"
    )
    code, _ = await call(nc, "mesh.tool.store.remember", {"key": "a", "value": 1})
    assert code == 200
    # Its bytecode was compiled once by the node (hash-based, unchecked): its children need not.
    (unpacked,) = [d for d in (node.state_dir / "bundles" / "store" / "1.0.0").glob("tools-*") if d.is_dir()]
    pyc = unpacked / "__pycache__" / f"raw_child.{sys.implementation.cache_tag}.pyc"
    assert pyc.is_file() and int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b01
    code, r_seat = await call(nc, "mesh.seat.kv.nope", {})
    assert code == 404  # the seat is held: its subject is served
    other_pid = (await wait_state(nc, node.name, "other/tools", "ready"))["pid"]
    # Upgrade one module: the other is not touched, the data survives.
    v2 = raw_artifact(tmp_path / "out", "store", "2.0.0", seats=["kv"])
    r = meshctl("bundle", "deliver", str(v2), "--node", node.name, url=nats_server.url)
    assert r.returncode == 0, r.stderr
    await wait_call(
        nc, "mesh.tool.store.version", {}, lambda r: r[0] == 200 and r[1]["structuredContent"]["version"] == "2.0.0"
    )
    code, res = await call(nc, "mesh.tool.store.remember", {})
    assert res["structuredContent"] == {"a": 1}
    assert (await status(nc, node.name))["bundles"][0]["module"] in ("store", "other")
    assert (await wait_state(nc, node.name, "other/tools", "ready"))["pid"] == other_pid
    # Redelivered identical: nothing changes (same pid, no restart).
    pid_v2 = (await wait_state(nc, node.name, "store/tools", "ready"))["pid"]
    r = meshctl("bundle", "deliver", str(v2), "--node", node.name, url=nats_server.url)
    assert r.returncode == 0 and "already in the object store" in r.stdout
    await asyncio.sleep(1)
    assert (await wait_state(nc, node.name, "store/tools", "ready"))["pid"] == pid_v2
    # Remove: its subjects go, the other module serves on.
    r = meshctl("bundle", "remove", "store", "--node", node.name, url=nats_server.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"node {node.name}: removed store; delivered modules left on it: other", r.stdout
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(b["module"] == "store" for b in (await status(nc, node.name))["bundles"]):
            break
        await asyncio.sleep(0.1)
    assert not any(b["module"] == "store" for b in (await status(nc, node.name))["bundles"])
    code, _ = await call(nc, "mesh.tool.other.echo", {})
    assert code == 200
    # Redeliver after removal: back, with its data.
    r = meshctl("bundle", "deliver", str(v2), "--node", node.name, url=nats_server.url)
    assert r.returncode == 0, r.stderr
    code, res = await wait_call(nc, "mesh.tool.store.remember", {}, lambda r: r[0] == 200)
    assert res["structuredContent"] == {"a": 1}
    r = meshctl("bundle", "remove", "nothing-here", "--node", node.name, url=nats_server.url)
    assert r.returncode == 1 and "not a member of nothing-here" in r.stderr
    await nc.close()


def _tamper(artifact: Path, out: Path) -> Path:
    """Change one file's bytes but keep bundle.json (and its hashes) as they were."""
    raw = gzip.decompress(artifact.read_bytes())
    src = tarfile.open(fileobj=io.BytesIO(raw))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as dst:
        for m in src.getmembers():
            member = src.extractfile(m) if m.isfile() else None
            data = member.read() if member is not None else None
            if m.name == "raw_child.py" and data is not None:
                data = data.replace(b"Echo the arguments", b"Evil the arguments")
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    target = out / ("tampered-" + artifact.name)
    target.write_bytes(gzip.compress(buf.getvalue()))
    return target


async def test_tampered_artifact_is_refused_and_the_running_version_keeps_running(
    tmp_path: Path, node_factory, nats_server
) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    node = node_factory(empty)
    nc = await client(nats_server.url)
    v1 = raw_artifact(tmp_path / "out", "guarded", "1.0.0")
    assert meshctl("bundle", "deliver", str(v1), "--node", node.name, url=nats_server.url).returncode == 0
    await wait_call(nc, "mesh.tool.guarded.version", {}, lambda r: r[0] == 200)
    pid = (await wait_state(nc, node.name, "guarded/tools", "ready"))["pid"]
    v2 = raw_artifact(tmp_path / "out", "guarded", "2.0.0")
    bad = _tamper(v2, tmp_path)
    assert meshctl("bundle", "deliver", str(bad), "--node", node.name, url=nats_server.url).returncode == 0
    deadline = time.monotonic() + 10
    problems: list[str] = []
    while time.monotonic() < deadline:
        problems = (await status(nc, node.name))["problems"]
        if problems:
            break
        await asyncio.sleep(0.1)
    assert any("guarded" in p and "2.0.0 refused" in p and "raw_child.py" in p for p in problems), problems
    code, r = await call(nc, "mesh.tool.guarded.version", {})
    assert code == 200 and r["structuredContent"]["version"] == "1.0.0"
    assert (await wait_state(nc, node.name, "guarded/tools", "ready"))["pid"] == pid
    assert "refused" in node.log()
    await nc.close()


def test_deliver_a_missing_artifact_is_a_clear_error(tmp_path: Path, nats_server) -> None:
    r = meshctl("bundle", "deliver", str(tmp_path / "nope.tar.gz"), "--node", "x", url=nats_server.url)
    assert r.returncode == 2 and "no such artifact" in r.stderr
