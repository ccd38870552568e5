"""Membership values and artifacts as an attacker writes them: the node validates every field with
the manifest's own rules before it uses one, refuses one module at a time, never dies of it,
never writes outside its state folder, bounds what it fetches and unpacks, and names each
refusal once.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.faults.delivery_support import (
    MB,
    disk_bytes,
    error_lines,
    module_ref,
    put_membership,
    rss_mb,
    upload,
    wait_problem,
    write_artifact,
)
from tests.support.mesh import call, client, wait_state

pytestmark = pytest.mark.slow


async def _served(nc, module: str, version: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await call(nc, f"mesh.tool.{module}.version", {}, timeout=5)
            if last[0] == 200 and last[1]["structuredContent"]["version"] == version:
                return
        except Exception as e:  # no responders until the module is served
            last = e
        await asyncio.sleep(0.1)
    raise AssertionError(f"{module} {version} not served within {timeout} s; last {last!r}")


async def _good_node(tmp_path: Path, node_factory, nats_server, **kw: Any):
    empty = tmp_path / "none"
    empty.mkdir(exist_ok=True)
    node = node_factory(empty, **kw)
    nc = await client(nats_server.url)
    good = module_ref(
        "1.0.0", {"tools": await upload(nc, write_artifact(tmp_path / "out" / "good.tar.gz", "good", "1.0.0"))}
    )
    await put_membership(nc, node.name, {"good": good})
    await _served(nc, "good", "1.0.0")
    return node, nc, good


# --- item 1 ------------------------------------------------------------------------------------
async def test_hostile_membership_entries_are_each_one_modules_refusal_and_the_node_lives(
    tmp_path: Path, node_factory, nats_server
) -> None:
    node, nc, good = await _good_node(tmp_path, node_factory, nats_server)
    pid = (await wait_state(nc, node.name, "good/tools", "ready"))["pid"]
    bad = await upload(nc, write_artifact(tmp_path / "out" / "bad.tar.gz", "bad", "1.0.0"))
    long = "m" * 300
    cases: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
        "a 300-character module name": ({long: module_ref("1.0.0", {"tools": bad})}, ("mmmm", "module is")),
        "a seat with a space": ({"bad": module_ref("1.0.0", {"tools": bad}, seats=["a b"])}, ("bad", "seat is 'a b'")),
        "a seat that is a wildcard": (
            {"bad": module_ref("1.0.0", {"tools": bad}, seats=[">"])},
            ("bad", "seat is '>'"),
        ),
        "a 300-character version": ({"bad": module_ref("1" * 300, {"tools": bad})}, ("bad", "version is '111")),
        "a bundle key with a space": ({"bad": module_ref("1.0.0", {"a b": bad})}, ("bad", "bundle key is 'a b'")),
        "an object name of 300 characters": (
            {"bad": module_ref("1.0.0", {"tools": {**bad, "object": "o" * 300}})},
            ("bad", "object is 'ooo"),
        ),
        "an entry of the wrong shape": (
            {"bad": {"version": 1, "seats": "all", "bundles": []}},
            ("bad", "not a membership entry"),
        ),
        "a language no toolchain has": (
            {"bad": module_ref("1.0.0", {"tools": {**bad, "language": "cobol"}})},
            ("bad", "language is 'cobol'"),
        ),
    }
    for what, (modules, words) in cases.items():
        await put_membership(nc, node.name, {"good": good, **modules})
        problem = await wait_problem(nc, node.name, *words)
        assert "refused" in problem, (what, problem)
        assert node.proc.poll() is None, f"{what}: the node exited ({node.proc.returncode}):\n{node.log()[-3000:]}"
        code, result = await call(nc, "mesh.tool.good.version", {})
        assert code == 200 and result["structuredContent"]["version"] == "1.0.0", what
    # The entries stay in KV: the node still lives a while later, the good module untouched.
    await asyncio.sleep(2)
    assert node.proc.poll() is None
    assert (await wait_state(nc, node.name, "good/tools", "ready"))["pid"] == pid
    assert "Traceback" not in node.log()
    # A fixed entry is taken: the refusal is gone from status.
    await put_membership(nc, node.name, {"good": good, "bad": module_ref("1.0.0", {"tools": bad})})
    await _served(nc, "bad", "1.0.0")
    await nc.close()


# --- item 4 ------------------------------------------------------------------------------------
async def test_membership_fields_never_lead_a_path_out_of_the_state_folder(
    tmp_path: Path, node_factory, nats_server
) -> None:
    node, nc, good = await _good_node(tmp_path, node_factory, nats_server)
    esc = await upload(nc, write_artifact(tmp_path / "out" / "esc.tar.gz", "esc", "1.0.0"))
    # An artifact lying outside the state folder, named by its path instead of a hash: never trusted.
    outside = write_artifact(tmp_path / "planted" / "p.tar.gz", "esc", "1.0.0")
    planted = {**esc, "sha256": str(outside)[: -len(".tar.gz")]}
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "module": ({"../../esc1": module_ref("1.0.0", {"tools": esc})}, "'../../esc1'"),
        "version": ({"esc": module_ref("../../../esc2", {"tools": esc})}, "'../../../esc2'"),
        "bundle key": ({"esc": module_ref("1.0.0", {"../../../../esc3": esc})}, "'../../../../esc3'"),
        "sha256": ({"esc": module_ref("1.0.0", {"tools": planted})}, "sha256 is"),
    }
    before = set(os.listdir(tmp_path))
    for what, (modules, word) in cases.items():
        await put_membership(nc, node.name, {"good": good, **modules})
        problem = await wait_problem(nc, node.name, word, "refused")
        assert node.proc.poll() is None, what
        created = set(os.listdir(tmp_path)) - before
        assert not created, f"{what}: the node wrote outside its state folder: {created} ({problem})"
        code, _ = await call(nc, "mesh.tool.good.version", {})
        assert code == 200
    # The planted artifact was never served.
    with pytest.raises(nats.errors.NoRespondersError):
        await call(nc, "mesh.tool.esc.version", {}, timeout=2)
    await nc.close()


# --- item 6 ------------------------------------------------------------------------------------
async def test_an_artifact_unpacking_to_a_gibibyte_is_refused_before_it_is_written(
    tmp_path: Path, node_factory, nats_server
) -> None:
    node, nc, good = await _good_node(tmp_path, node_factory, nats_server)
    bomb_path = write_artifact(tmp_path / "out" / "bomb.tar.gz", "bomb", "1.0.0", members={"zeros": 1024 * MB}, level=9)
    packed = bomb_path.stat().st_size
    assert packed < 2 * MB, packed
    bomb = module_ref("1.0.0", {"tools": await upload(nc, bomb_path)})
    rss_before, _ = rss_mb(node.proc.pid)
    await put_membership(nc, node.name, {"good": good, "bomb": bomb})
    problem = await wait_problem(nc, node.name, "bomb", "refused", timeout=60)
    rss_after, peak = rss_mb(node.proc.pid)
    used = disk_bytes(node.state_dir)
    print(f"\nzip bomb: {packed} bytes packed, 1 GiB unpacked; refused: {problem}")
    print(f"node RSS {rss_before:.0f} -> {rss_after:.0f} MB (peak {peak:.0f} MB); state folder {used / MB:.1f} MB")
    assert "max_ratio" in problem or "max_unpacked_bytes" in problem, problem
    assert used < 64 * MB, f"{used} bytes on disk in the state folder"
    assert peak < 300, peak
    code, _ = await call(nc, "mesh.tool.good.version", {})
    assert code == 200
    await nc.close()


LIMITS = """
[delivery]
max_artifact_bytes = 4194304
max_members = 50
"""


async def test_delivery_limits_from_the_config_refuse_naming_the_limit(
    tmp_path: Path, node_factory, nats_server
) -> None:
    from tests.support.mesh import FAST_CONFIG

    node, nc, good = await _good_node(tmp_path, node_factory, nats_server, config=FAST_CONFIG + LIMITS)
    big = write_artifact(tmp_path / "out" / "big.tar.gz", "big", "1.0.0", members={"r": os.urandom(6 * MB)}, level=0)
    many = write_artifact(
        tmp_path / "out" / "many.tar.gz", "many", "1.0.0", members={f"f/{i}": b"x" for i in range(80)}
    )
    modules = {
        "good": good,
        "big": module_ref("1.0.0", {"tools": await upload(nc, big)}),
        "many": module_ref("1.0.0", {"tools": await upload(nc, many)}),
    }
    await put_membership(nc, node.name, modules)
    problem = await wait_problem(nc, node.name, "big", "refused")
    assert "max_artifact_bytes" in problem and "4194304" in problem, problem
    problem = await wait_problem(nc, node.name, "many", "refused")
    assert "max_members" in problem and "50" in problem, problem
    assert not list((node.state_dir / "artifacts").glob("*big*")), "the oversized object was stored"
    await nc.close()


async def test_a_40mb_artifact_is_streamed_to_disk_not_held_in_memory(
    tmp_path: Path, node_factory, nats_server
) -> None:
    node, nc, good = await _good_node(tmp_path, node_factory, nats_server)
    path = write_artifact(
        tmp_path / "out" / "large.tar.gz", "large", "1.0.0", members={"r": os.urandom(40 * MB)}, level=0
    )
    large = module_ref("1.0.0", {"tools": await upload(nc, path)})
    await asyncio.sleep(0.5)
    rss_before, peak_before = rss_mb(node.proc.pid)
    await put_membership(nc, node.name, {"good": good, "large": large})
    # Calls to another module are answered while the artifact is fetched and hashed.
    slowest = 0.0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = time.monotonic()
        code, _ = await call(nc, "mesh.tool.good.version", {})
        assert code == 200
        slowest = max(slowest, time.monotonic() - started)
        try:
            code, r = await call(nc, "mesh.tool.large.version", {}, timeout=2)
            if code == 200:
                break
        except Exception:  # not served yet
            pass
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the 40 MB artifact was not served within 60 s")
    rss_after, peak = rss_mb(node.proc.pid)
    print(
        f"\n40 MB artifact: node RSS {rss_before:.0f} -> {rss_after:.0f} MB, peak {peak_before:.0f} -> {peak:.0f} MB; "
        f"slowest call to another module meanwhile {slowest * 1000:.0f} ms"
    )
    assert peak - peak_before < 30, f"the node's peak RSS grew by {peak - peak_before:.0f} MB for a 40 MB artifact"
    assert peak < 300
    await nc.close()


# --- item 16, second half ------------------------------------------------------------------------
async def test_a_refused_version_is_named_once_not_on_every_membership_change(
    tmp_path: Path, node_factory, nats_server
) -> None:
    node, nc, good = await _good_node(tmp_path, node_factory, nats_server)
    # A bundle.json whose file hashes do not match the files: refused at verification.
    tampered = write_artifact(tmp_path / "out" / "t.tar.gz", "tamp", "1.0.0", members={"x": b"a"})
    ref = await upload(nc, tampered)
    other = await upload(nc, write_artifact(tmp_path / "out" / "o.tar.gz", "other", "1.0.0"))
    hostile = module_ref("1.0.0", {"tools": {**ref, "sha256": "0" * 64}})  # the object does not match it
    await put_membership(nc, node.name, {"good": good, "tamp": hostile})
    await wait_problem(nc, node.name, "tamp", "refused")
    for i in range(15):
        modules = {"good": good, "tamp": hostile}
        if i % 2 == 0:
            modules["other"] = module_ref("1.0.0", {"tools": other})
        await put_membership(nc, node.name, modules)
        await asyncio.sleep(0.15)
    await asyncio.sleep(1)
    await wait_problem(nc, node.name, "tamp", "refused")
    lines = error_lines(node.log(), "tamp")
    print(f"\n15 membership changes after one refusal: {len(lines)} ERROR lines about it")
    assert len(lines) == 1, "\n".join(lines)
    await nc.close()
