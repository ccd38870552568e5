"""The node end to end: a real nats-server, a real node process, real children."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.mesh import alive, bundle_status, call, client, make_module, marked_processes, status, wait_state


async def test_call_over_the_bus(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    code, result = await call(nc, "mesh.tool.alpha.echo", {"name": "Ada"})
    assert code == 200
    assert result["structuredContent"] == {"name": "Ada"}
    assert result["isError"] is False
    # An empty body is an empty arguments object.
    msg = await nc.request("mesh.tool.alpha.echo", b"", timeout=5)
    assert msg.headers is None or "Nats-Service-Error-Code" not in msg.headers
    await nc.close()


async def test_200_concurrent_calls_on_one_child(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    results = await asyncio.gather(
        *(call(nc, "mesh.tool.alpha.echo", {"i": i, "pad": "x" * (i % 50)}) for i in range(200))
    )
    for i, (code, result) in enumerate(results):
        assert code == 200
        assert result["structuredContent"] == {"i": i, "pad": "x" * (i % 50)}
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["restarts"] == 0 and b["calls"] >= 200
    await nc.close()


async def test_child_killed_mid_call_gets_503_at_once_then_serves(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=20000)
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    first = await wait_state(nc, node.name, "alpha/tools", "ready")
    pending = asyncio.create_task(call(nc, "mesh.tool.alpha.sleep", {"seconds": 15}, timeout=20))
    await asyncio.sleep(0.3)
    killed_at = time.monotonic()
    os.kill(first["pid"], signal.SIGKILL)
    code, body = await pending
    waited = time.monotonic() - killed_at
    assert code == 503, body
    assert waited < 1.0, f"the caller waited {waited:.2f} s"
    err = body["error"]
    assert err["bundle"] == "alpha/tools" and err["module"] == "alpha" and "SIGKILL" in (err["last_exit"] or "")
    assert err["ways_out"]
    deadline = time.monotonic() + 10
    while True:
        code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "restart"})
        if code == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert code == 200 and result["structuredContent"] == {"after": "restart"}
    again = await bundle_status(nc, node.name, "alpha/tools")
    assert again["pid"] != first["pid"] and again["restarts"] >= 1
    await nc.close()


async def test_crash_loop_ends_failed_while_another_bundle_serves(tmp_path: Path, node_factory) -> None:
    ok_file = tmp_path / "fixed"
    make_module(tmp_path / "mods", "broken", env={"RAW_MODE": "exit_at_start", "RAW_OK_FILE": str(ok_file)})
    make_module(tmp_path / "mods", "good")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    failed = await wait_state(nc, node.name, "broken/tools", "failed", timeout=20)
    assert failed["restarts"] >= 3
    assert failed["last_exit"] == "exit code 2"
    assert any("configuration is missing" in line for line in failed["stderr_tail"])
    node.wait_log("bundle broken/tools failed")
    assert "ERROR mesh.bundle: bundle broken/tools failed" in node.log()
    # The failed bundle's tools answer 503 at once, naming it; the other bundle serves.
    started = time.monotonic()
    code, body = await call(nc, "mesh.tool.broken.echo", {})
    assert code == 503 and time.monotonic() - started < 1
    assert body["error"]["state"] == "failed" and body["error"]["bundle"] == "broken/tools"
    assert any("meshctl node restart" in w for w in body["error"]["ways_out"])
    code, result = await call(nc, "mesh.tool.good.echo", {"still": "serving"})
    assert code == 200 and result["structuredContent"] == {"still": "serving"}
    # Fixed, then reset by an operator: it serves again.
    ok_file.write_text("ok")
    reply = await nc.request(f"mesh.node.{node.name}.restart", b'{"bundle": "broken/tools"}', timeout=5)
    assert b'"ok":true' in reply.data
    await wait_state(nc, node.name, "broken/tools", "ready")
    code, result = await call(nc, "mesh.tool.broken.echo", {"back": True})
    assert code == 200 and result["structuredContent"] == {"back": True}
    await nc.close()


async def test_child_that_never_answers_initialize_is_named_failed(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "mute", env={"RAW_MODE": "no_init"})
    make_module(tmp_path / "mods", "good")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    code, _ = await call(nc, "mesh.tool.good.echo", {})
    assert code == 200
    failed = await wait_state(nc, node.name, "mute/tools", "failed", timeout=30)
    assert "did not complete the MCP handshake" in failed["last_error"]
    assert "initialize" in failed["last_error"]
    code, body = await call(nc, "mesh.tool.mute.anything", {})
    assert code == 503 and body["error"]["state"] == "failed"
    await nc.close()


async def test_call_past_its_timeout_is_504_cancelled_and_child_still_serves(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=500)
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    before = await wait_state(nc, node.name, "alpha/tools", "ready")
    started = time.monotonic()
    code, body = await call(nc, "mesh.tool.alpha.sleep", {"seconds": 5})
    assert code == 504, body
    assert 0.4 < time.monotonic() - started < 2
    assert body["error"]["timeout_ms"] == 500
    code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "timeout"})
    assert code == 200
    deadline = time.monotonic() + 5
    while True:  # the child was told: it logs the cancellation on stderr
        b = await bundle_status(nc, node.name, "alpha/tools")
        if any(line.startswith("cancelled ") for line in b["stderr_tail"]) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert any(line.startswith("cancelled ") for line in b["stderr_tail"])
    assert b["pid"] == before["pid"] and b["restarts"] == 0
    await nc.close()


async def test_bad_request_not_found_and_too_large(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", seats=["memory"])
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    code, body = await call(nc, "mesh.tool.alpha.echo", raw=b"{not json")
    assert code == 400 and "not valid JSON" in body["error"]["message"]
    code, body = await call(nc, "mesh.tool.alpha.echo", raw=b"[1, 2]")
    assert code == 400 and "JSON object" in body["error"]["message"]
    code, body = await call(nc, "mesh.tool.alpha.nope", {})
    assert code == 404 and "no tool 'nope'" in body["error"]["message"]
    assert "mesh.tool.alpha.echo" in body["error"]["known"]
    code, body = await call(nc, "mesh.seat.memory.nope", {})
    assert code == 404 and "no verb 'nope'" in body["error"]["message"]
    # A result larger than the bus carries goes through the object store (docs/bus.md; the
    # 413 past its cap is in tests/test_bus_calls.py), and the child still serves.
    code, body = await call(nc, "mesh.tool.alpha.big", {"bytes": 2 * 1024 * 1024})
    assert code == 200 and body["bucket"] == "mesh-calls" and body["size"] > 2 * 1024 * 1024, body
    code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "big"})
    assert code == 200
    # A request the node itself must refuse is never one it silently drops.
    with pytest.raises(Exception):  # noqa: B017 (the client refuses it, or the server: either is an error)
        await nc.request("mesh.tool.alpha.echo", b"{" + b" " * (nc.max_payload + 10) + b"}", timeout=2)
    code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "huge request"})
    assert code == 200
    await nc.close()


async def test_noisy_child_is_served(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "noisy", env={"RAW_MODE": "noisy"})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "noisy/tools", "ready")
    results = await asyncio.gather(*(call(nc, "mesh.tool.noisy.echo", {"i": i}) for i in range(300)))
    assert all(code == 200 and r["structuredContent"] == {"i": i} for i, (code, r) in enumerate(results))
    b = await bundle_status(nc, node.name, "noisy/tools")
    assert b["restarts"] == 0
    assert any("noise" in line for line in b["stderr_tail"])
    node.wait_log("skipped a line on stdout that is not JSON-RPC")
    await nc.close()


async def test_tools_list_changed_updates_subjects(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    code, _ = await call(nc, "mesh.tool.alpha.extra0", {})
    assert code == 404
    code, _ = await call(nc, "mesh.tool.alpha.add_tool", {})
    assert code == 200
    deadline = time.monotonic() + 5
    while True:
        code, result = await call(nc, "mesh.tool.alpha.extra0", {"new": 1})
        if code == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert code == 200 and result["structuredContent"] == {"new": 1}
    assert "extra0" in (await bundle_status(nc, node.name, "alpha/tools"))["tools"]
    await nc.close()


async def test_unanswered_ping_restarts_child(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "deaf", env={"RAW_MODE": "no_ping"})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    first = await wait_state(nc, node.name, "deaf/tools", "ready")
    node.wait_log("stopped answering ping", timeout=10)
    deadline = time.monotonic() + 10
    while True:
        b = await bundle_status(nc, node.name, "deaf/tools")
        if (b["pid"] and b["pid"] != first["pid"]) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert b["pid"] != first["pid"] and b["restarts"] >= 1
    assert not alive(first["pid"])
    await nc.close()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_no_child_process_survives_the_node(tmp_path: Path, node_factory, how: str) -> None:
    make_module(tmp_path / "mods", "alpha")
    make_module(tmp_path / "mods", "beta", env={"RAW_MODE": "ignore_term"})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    await wait_state(nc, node.name, "beta/tools", "ready")
    code, r1 = await call(nc, "mesh.tool.alpha.grandchild", {})
    code2, r2 = await call(nc, "mesh.tool.beta.grandchild", {"setsid": True})
    assert code == 200 and code2 == 200
    pids = r1["structuredContent"]["pids"] + r2["structuredContent"]["pids"]
    # A process that has just exec'd shows its environment a moment later (the kernel closes the
    # exec pipe Popen waits on before it lays out the new environment): look until all six show.
    deadline = time.monotonic() + 5
    while len(before := marked_processes(node.name)) < 6 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(before) >= 6 and all(alive(p) for p in pids)
    await nc.close()
    if how == "sigterm":
        assert node.terminate() == 0
    else:
        node.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (marked_processes(node.name) or any(alive(p) for p in before + pids)):
        await asyncio.sleep(0.05)
    left = [(p, Path(f"/proc/{p}/cmdline").read_bytes() if alive(p) else b"") for p in before + pids if alive(p)]
    assert marked_processes(node.name) == [] and left == [], (left, node.log()[-3000:])


async def test_grandchildren_do_not_survive_a_restart(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    code, r = await call(nc, "mesh.tool.alpha.grandchild", {"setsid": True})
    pids = r["structuredContent"]["pids"]
    code, _ = await call(nc, "mesh.tool.alpha.crash", {})
    assert code == 503
    await wait_state(nc, node.name, "alpha/tools", "ready")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        await asyncio.sleep(0.05)
    assert not any(alive(p) for p in pids)
    await nc.close()


async def test_sigterm_answers_calls_in_flight_then_exits(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=10000)
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    calls = [asyncio.create_task(call(nc, "mesh.tool.alpha.sleep", {"seconds": 1}, timeout=10)) for _ in range(30)]
    await asyncio.sleep(0.3)
    node.proc.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*calls)
    assert [code for code, _ in results] == [200] * 30
    assert await asyncio.to_thread(node.proc.wait, 15) == 0
    assert "node " + node.name + " stopped" in node.log()
    await nc.close()


async def test_second_seat_holder_is_refused_at_load(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "first", seats=["echo"])
    make_module(tmp_path / "mods", "second", seats=["echo"])
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "first/tools", "ready")
    await wait_state(nc, node.name, "second/tools", "ready")
    seats = (await status(nc, node.name))["seats"]
    held = [s for s in seats if s["state"] == "held"]
    refused = [s for s in seats if s["state"] == "refused"]
    assert [(s["seat"], s["module"]) for s in held] == [("echo", "first")]
    assert [(s["seat"], s["module"]) for s in refused] == [("echo", "second")]
    assert "module first already holds seat echo" in refused[0]["reason"]
    assert "claim of module second refused" in node.log()
    # Every seat call reaches the holder's child, never the refused one's.
    pid_first = (await bundle_status(nc, node.name, "first/tools"))["pid"]
    code, r = await call(nc, "mesh.seat.echo.say", {"who": "holder"})
    assert code == 200 and r["structuredContent"] == {"who": "holder"}
    b_second = await bundle_status(nc, node.name, "second/tools")
    b_first = await bundle_status(nc, node.name, "first/tools")
    assert b_first["pid"] == pid_first and b_first["calls"] >= 1 and b_second["calls"] == 0
    # The refused module's seat verb is not served under its own tool subject either.
    code, _ = await call(nc, "mesh.tool.second.echo.say", {})
    assert code == 404
    await nc.close()


async def test_stateful_seat_held_by_another_node_is_refused(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "a", "store", seats=["memory"])
    make_module(tmp_path / "b", "store", seats=["memory"])
    first = node_factory(tmp_path / "a")
    second = node_factory(tmp_path / "b")
    nc = await client(first.bus_url())
    seats = (await status(nc, second.name))["seats"]
    assert seats[0]["state"] == "elsewhere" and seats[0]["holder"] == first.name
    # Its child runs, but it serves nothing here: shown on standby, never `ready`.
    await wait_state(nc, second.name, "store/tools", "standby")
    await wait_state(nc, first.name, "store/tools", "ready")
    assert f"node {first.name} holds seat memory" in seats[0]["reason"]
    assert second.log().count(f"seat memory: not served by module store on node {second.name}") == 1
    # The module's own tools share the seat's store: only the holder answers them.
    for _ in range(10):
        code, r = await call(nc, "mesh.tool.store.whoami")
        assert code == 200 and r["structuredContent"]["node"] == first.name
    await nc.close()


async def test_child_environment_is_built_from_scratch(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", extra_bundle='pass_env = ["GRANTED_VAR"]')
    node = node_factory(
        tmp_path / "mods", env={"MESH_NATS_TOKEN": "s3cret", "NODE_SECRET": "hidden", "GRANTED_VAR": "yes"}
    )
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    code, r = await call(nc, "mesh.tool.alpha.env", {})
    env = r["structuredContent"]
    assert env["MESH_NODE"] == node.name and env["MESH_MODULE"] == "alpha" and env["MESH_BUNDLE"] == "tools"
    assert Path(env["MESH_DATA_DIR"]).is_dir() and Path(env["MESH_BUNDLE_DIR"]).is_dir()
    assert Path(env["MESH_DATA_DIR"]).is_relative_to(node.state_dir)
    assert env["GRANTED_VAR"] == "yes"
    assert "MESH_NATS_TOKEN" not in env and "NODE_SECRET" not in env
    assert "s3cret" not in repr(env) and "hidden" not in repr(env)
    await nc.close()


@pytest.mark.parametrize("revision", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
async def test_children_of_every_protocol_revision(tmp_path: Path, node_factory, revision: str) -> None:
    make_module(tmp_path / "mods", "alpha", env={"RAW_PROTOCOL": revision})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    b = await wait_state(nc, node.name, "alpha/tools", "ready")
    assert b["protocol_version"] == revision
    code, _ = await call(nc, "mesh.tool.alpha.echo", {})
    assert code == 200
    await nc.close()


async def test_child_of_an_unknown_revision_is_refused_clearly(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "future", env={"RAW_PROTOCOL": "2099-01-01"})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    b = await wait_state(nc, node.name, "future/tools", "failed", timeout=20)
    assert "2099-01-01" in b["last_error"] and "2025-11-25" in b["last_error"]
    await nc.close()


async def test_node_starts_when_every_bundle_and_a_manifest_fail(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "broken", env={"RAW_MODE": "exit_at_start"})
    bad = tmp_path / "mods" / "bad-manifest"
    bad.mkdir()
    (bad / "module.toml").write_text('name = "Bad Name"\nversion = "1"\n[[bundle]]\nname = "t"\nkind = "tool"\n')
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "broken/tools", "failed", timeout=20)
    st = await status(nc, node.name)
    assert any("bad-manifest/module.toml: name:" in p for p in st["problems"])
    assert any("kind" in p for p in st["problems"])
    assert "ERROR mesh.cli: module not loaded" in node.log()
    await nc.close()


async def test_arguments_failing_the_input_schema_are_400_naming_the_field(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    cases = [
        ({}, "name", "required argument 'name' is missing"),
        ({"name": 5}, "name", "is an integer; it must be string"),
        ({"name": "a", "count": 1.5}, "count", "is a number; it must be integer"),
        ({"name": "a", "count": "3"}, "count", "is a string; it must be integer"),
        ({"name": "a", "colour": "red"}, "colour", "unknown argument 'colour'"),
    ]
    for args, field, text in cases:
        code, body = await call(nc, "mesh.tool.alpha.typed", args)
        assert code == 400, (args, body)
        assert body["error"]["field"] == field and text in body["error"]["message"], body
    code, r = await call(nc, "mesh.tool.alpha.typed", {"name": "a", "count": 2, "ratio": 1})
    assert code == 200 and r["structuredContent"] == {"name": "a", "count": 2, "ratio": 1}
    assert (await bundle_status(nc, node.name, "alpha/tools"))["calls"] == 1  # the bad calls never reached the child
    await nc.close()


async def test_calls_left_after_the_drain_timeout_are_answered_node_stopping(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=30000)
    config = __import__("tests.support.mesh", fromlist=["FAST_CONFIG"]).FAST_CONFIG.replace(
        "drain_timeout_s = 10", "drain_timeout_s = 0.5"
    )
    node = node_factory(tmp_path / "mods", config=config)
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    calls = [asyncio.create_task(call(nc, "mesh.tool.alpha.sleep", {"seconds": 20}, timeout=15)) for _ in range(5)]
    await asyncio.sleep(0.3)
    node.proc.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*calls)
    assert [code for code, _ in results] == [503] * 5
    assert all(body["error"]["kind"] == "node_stopping" for _, body in results)
    assert await asyncio.to_thread(node.proc.wait, 15) == 0
    await nc.close()
