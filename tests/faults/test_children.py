"""Children that misbehave: killed, hung, deaf, dying at start, mute at the handshake, noisy,
too talkative, leaving grandchildren behind, deaf to SIGTERM. The node answers every call,
restarts what it should, gives up on what it must, and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.faults.conftest import config, meshctl, start_times
from tests.support.mesh import (
    alive,
    bundle_status,
    call,
    client,
    make_module,
    marked_processes,
    status,
    wait_for,
    wait_state,
)


async def test_sigkill_with_50_calls_in_flight_answers_each_503_within_a_second(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=30000)
    make_module(tmp_path / "mods", "other")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    first = await wait_state(nc, node.name, "alpha/tools", "ready")
    other = await wait_state(nc, node.name, "other/tools", "ready")

    answered_at: dict[int, float] = {}

    async def one(i: int) -> tuple[int, dict]:
        code, body = await call(nc, "mesh.tool.alpha.sleep", {"seconds": 25, "i": i}, timeout=30)
        answered_at[i] = time.monotonic()
        return code, body

    calls = [asyncio.create_task(one(i)) for i in range(50)]
    # Every one of the 50 is in the child before it dies.
    await wait_for(
        lambda: _in_flight_is(nc, node.name, "alpha/tools", 50), "50 calls in flight on alpha/tools", timeout=20
    )
    killed_at = time.monotonic()
    os.kill(first["pid"], signal.SIGKILL)
    done, pending = await asyncio.wait(calls, timeout=10)
    assert not pending, f"{len(pending)} of 50 calls still unanswered 10 s after the kill"
    for i, task in enumerate(calls):
        code, body = task.result()
        assert code == 503, (i, body)
        assert body["error"]["bundle"] == "alpha/tools" and "SIGKILL" in (body["error"]["last_exit"] or ""), body
        waited = answered_at[i] - killed_at
        assert waited < 1.0, f"call {i} was answered {waited:.2f} s after the kill"

    # The bundle comes back on its own and serves; nothing of the dead child is left.
    async def serving() -> bool:
        code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "kill"}, timeout=5)
        return code == 200 and result["structuredContent"] == {"after": "kill"}

    await wait_for(serving, "alpha serves again after the kill")
    again = await bundle_status(nc, node.name, "alpha/tools")
    assert again["state"] == "ready" and again["pid"] != first["pid"] and again["restarts"] == 1
    assert again["in_flight"] == 0
    assert not alive(first["pid"])
    st = await status(nc, node.name)
    assert st["in_flight"] == 0, st["in_flight"]
    # The other bundle never noticed.
    still = await bundle_status(nc, node.name, "other/tools")
    assert still["pid"] == other["pid"] and still["restarts"] == 0
    await nc.close()


async def _in_flight_is(nc, node: str, key: str, n: int) -> bool:
    return (await bundle_status(nc, node, key))["in_flight"] == n


async def test_hung_call_is_504_at_its_timeout_cancelled_in_the_child_while_others_are_answered(
    tmp_path: Path, node_factory
) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=3000)
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    before = await wait_state(nc, node.name, "alpha/tools", "ready")
    started = time.monotonic()
    hung = asyncio.create_task(call(nc, "mesh.tool.alpha.sleep", {"seconds": 120}, timeout=10))
    await asyncio.sleep(0.1)
    # Meanwhile the same child answers everything else: quick calls and short sleeps.
    others = await asyncio.gather(
        *(call(nc, "mesh.tool.alpha.echo", {"i": i}, timeout=5) for i in range(30)),
        *(call(nc, "mesh.tool.alpha.sleep", {"seconds": 0.3}, timeout=5) for _ in range(5)),
    )
    assert not hung.done(), "the hung call was answered before its timeout"
    assert [code for code, _ in others] == [200] * 35
    assert [r["structuredContent"] for _, r in others[:30]] == [{"i": i} for i in range(30)]
    code, body = await hung
    waited = time.monotonic() - started
    assert code == 504, body
    assert 2.9 <= waited < 6.0, f"answered 504 after {waited:.2f} s for a 3 s timeout"
    assert body["error"]["timeout_ms"] == 3000 and body["error"]["bundle"] == "alpha/tools"

    # The child was told to stop working on it (it logs "cancelled <id>" on stderr).
    async def cancelled() -> bool:
        b = await bundle_status(nc, node.name, "alpha/tools")
        return any(re.fullmatch(r"cancelled \d+", line) for line in b["stderr_tail"])

    await wait_for(cancelled, "the child logs the cancellation", timeout=5)
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0 and b["in_flight"] == 0
    await nc.close()


async def test_child_that_stops_answering_ping_is_killed_and_restarted(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "deaf", env={"RAW_MODE": "no_ping"})
    make_module(tmp_path / "mods", "good")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    first = await wait_state(nc, node.name, "deaf/tools", "ready")
    good = await wait_state(nc, node.name, "good/tools", "ready")

    async def replaced() -> dict | None:
        b = await bundle_status(nc, node.name, "deaf/tools")
        return b if b["pid"] and b["pid"] != first["pid"] else None

    # interval 0.5 s, 2 misses of 0.5 s: killed within a few seconds of going quiet.
    b = await wait_for(replaced, "the deaf child replaced", timeout=15)
    assert b["restarts"] >= 1
    assert "stopped answering ping" in (b["last_error"] or "")
    assert "killed by SIGKILL" in (b["last_exit"] or "")
    assert not alive(first["pid"])
    assert "ERROR mesh.bundle: bundle deaf/tools stopped answering ping" in node.log()
    g = await bundle_status(nc, node.name, "good/tools")
    assert g["pid"] == good["pid"] and g["restarts"] == 0
    await nc.close()


BACKOFF_CONFIG = config(max_restarts="4", window_s="60", backoff_initial_s="0.4", backoff_max_s="1.6")


@pytest.mark.slow
async def test_child_exiting_at_start_backs_off_then_fails_then_meshctl_restart_brings_it_back(
    tmp_path: Path, node_factory
) -> None:
    ok_file, starts = tmp_path / "fixed", tmp_path / "starts.log"
    make_module(
        tmp_path / "mods",
        "broken",
        env={"RAW_MODE": "exit_at_start", "RAW_OK_FILE": str(ok_file), "RAW_START_LOG": str(starts)},
    )
    make_module(tmp_path / "mods", "good")
    node = node_factory(tmp_path / "mods", config=BACKOFF_CONFIG)
    nc = await client(node.bus_url())
    good = await wait_state(nc, node.name, "good/tools", "ready")
    failed = await wait_state(nc, node.name, "broken/tools", "failed", timeout=30)

    # 4 restarts allowed: 5 starts, then failed. The first restart is at once; the next ones wait
    # backoff_initial_s * 2^k with a jitter of 50-100 %: at least 0.2, 0.4, 0.8 s.
    times = start_times(starts)
    assert len(times) == 5, times
    gaps = [b - a for a, b in zip(times, times[1:])]
    for k, minimum in ((1, 0.2), (2, 0.4), (3, 0.8)):
        assert gaps[k] >= minimum, f"restart {k + 1} came {gaps[k]:.2f} s after the previous start; gaps {gaps}"
    assert failed["restarts"] == 4 and failed["pid"] is None
    assert failed["last_exit"] == "exit code 2"
    assert any("configuration is missing" in line for line in failed["stderr_tail"])
    assert "ERROR mesh.bundle: bundle broken/tools failed" in node.log()
    assert len(re.findall(r"WARNING mesh.bundle: bundle broken/tools restarts in", node.log())) == 3

    # Failed stays failed: no more starts on its own.
    await asyncio.sleep(2)
    assert len(start_times(starts)) == 5
    code, body = await call(nc, "mesh.tool.broken.echo", {})
    assert code == 503 and body["error"]["state"] == "failed"
    assert any(f"meshctl node restart broken/tools --name {node.name}" in w for w in body["error"]["ways_out"])

    # The node and the other bundle were never touched.
    assert node.proc.poll() is None
    g = await bundle_status(nc, node.name, "good/tools")
    assert g["pid"] == good["pid"] and g["restarts"] == 0
    code, _ = await call(nc, "mesh.tool.good.echo", {})
    assert code == 200

    # Fixed by the operator, then restarted with the CLI: it serves again.
    ok_file.write_text("ok")
    done = await asyncio.to_thread(
        meshctl, "node", "restart", "broken/tools", "--nats", node.bus_url(), "--name", node.name
    )
    assert done.returncode == 0, done.stderr
    assert f"restarting broken/tools on node {node.name} (was failed)" in done.stdout
    back = await wait_state(nc, node.name, "broken/tools", "ready", timeout=15)
    assert back["pid"] and alive(back["pid"])
    code, result = await call(nc, "mesh.tool.broken.echo", {"back": True})
    assert code == 200 and result["structuredContent"] == {"back": True}
    await nc.close()


@pytest.mark.slow
async def test_child_that_never_answers_initialize_backs_off_then_fails_and_leaves_nothing_running(
    tmp_path: Path, node_factory
) -> None:
    ok_file, starts = tmp_path / "fixed", tmp_path / "starts.log"
    make_module(
        tmp_path / "mods",
        "mute",
        env={"RAW_MODE": "no_init", "RAW_OK_FILE": str(ok_file), "RAW_START_LOG": str(starts)},
    )
    make_module(tmp_path / "mods", "good")
    cfg = config(init_timeout_s="1", max_restarts="3", backoff_initial_s="0.4", backoff_max_s="1.6")
    node = node_factory(tmp_path / "mods", config=cfg)
    nc = await client(node.bus_url())
    good = await wait_state(nc, node.name, "good/tools", "ready")
    # A call while it tries to start waits for the start, then is answered 503 (never hangs).
    code, body = await call(nc, "mesh.tool.mute.echo", {}, timeout=15)
    assert code == 503, body
    failed = await wait_state(nc, node.name, "mute/tools", "failed", timeout=40)
    times = start_times(starts)
    assert len(times) == 4, times
    gaps = [b - a for a, b in zip(times, times[1:])]
    # Each attempt waits out the 1 s handshake; from the second restart on, a backoff comes on top.
    assert all(g >= 0.9 for g in gaps), gaps
    assert gaps[1] >= 1.0 + 0.2 and gaps[2] >= 1.0 + 0.4, gaps
    assert "initialize" in failed["last_error"] and "did not complete the MCP handshake" in failed["last_error"]
    assert "ERROR mesh.bundle: bundle mute/tools failed" in node.log()
    # None of the mute children is left running: only the good bundle's child carries the mark.
    assert marked_processes(node.name) == [good["pid"]]
    g = await bundle_status(nc, node.name, "good/tools")
    assert g["pid"] == good["pid"] and g["restarts"] == 0

    ok_file.write_text("ok")
    done = await asyncio.to_thread(
        meshctl, "node", "restart", "mute/tools", "--nats", node.bus_url(), "--name", node.name
    )
    assert done.returncode == 0, done.stderr
    await wait_state(nc, node.name, "mute/tools", "ready", timeout=15)
    code, result = await call(nc, "mesh.tool.mute.echo", {"spoke": True})
    assert code == 200 and result["structuredContent"] == {"spoke": True}
    await nc.close()


async def test_meshctl_restart_names_an_unknown_bundle(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    done = await asyncio.to_thread(
        meshctl, "node", "restart", "nope/tools", "--nats", node.bus_url(), "--name", node.name
    )
    assert done.returncode == 1
    assert "'nope/tools' is not on this node" in done.stderr and "alpha/tools" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", ["noisy", "garbage"])
async def test_child_writing_garbage_on_stdout_is_served(tmp_path: Path, node_factory, mode: str) -> None:
    make_module(tmp_path / "mods", "messy", env={"RAW_MODE": mode})
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    before = await wait_state(nc, node.name, "messy/tools", "ready")
    assert len(before["tools"]) > 10
    results = await asyncio.gather(*(call(nc, "mesh.tool.messy.echo", {"i": i}) for i in range(200)))
    assert [(code, r["structuredContent"]) for code, r in results] == [(200, {"i": i}) for i in range(200)]
    code, body = await call(nc, "mesh.tool.messy.sleep", {"seconds": 0.1})
    assert code == 200 and body["structuredContent"] == {"slept": 0.1}
    b = await bundle_status(nc, node.name, "messy/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0 and b["in_flight"] == 0
    node.wait_log("skipped a line on stdout that is not JSON-RPC")
    assert "Traceback" not in node.log()
    await nc.close()


async def test_result_larger_than_the_bus_goes_through_the_object_store_and_the_child_still_serves(
    tmp_path: Path, node_factory
) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    before = await wait_state(nc, node.name, "alpha/tools", "ready")
    limit = nc.max_payload
    # Past the bus's max payload: a reference to the object (docs/bus.md), not a 413.
    code, body = await call(nc, "mesh.tool.alpha.big", {"bytes": 2 * limit})
    assert code == 200 and body["bucket"] == "mesh-calls" and body["size"] > 2 * limit, body
    # Just under the limit goes through whole.
    code, result = await call(nc, "mesh.tool.alpha.big", {"bytes": limit - 4096})
    assert code == 200 and len(result["content"][0]["text"]) == limit - 4096
    code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "big"})
    assert code == 200 and result["structuredContent"] == {"after": "big"}
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0
    await nc.close()


@pytest.mark.parametrize("how", ["child restart", "node sigterm", "node sigkill"])
async def test_no_grandchild_survives(tmp_path: Path, node_factory, how: str) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    first = await wait_state(nc, node.name, "alpha/tools", "ready")
    pids: list[int] = []
    for setsid in (False, True):  # one in the child's group, one that left it with setsid
        code, r = await call(nc, "mesh.tool.alpha.grandchild", {"setsid": setsid})
        assert code == 200
        pids += r["structuredContent"]["pids"]
    assert len(pids) == 4 and all(alive(p) for p in pids)
    # /proc/PID/environ reads empty for an instant while a process execs: look again, briefly.
    deadline = time.monotonic() + 5
    while not set(pids) | {first["pid"]} <= set(marked_processes(node.name)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert set(pids) | {first["pid"]} <= set(marked_processes(node.name))
    if how == "child restart":
        code, _ = await call(nc, "mesh.tool.alpha.crash", {})
        assert code == 503
        again = await wait_state(nc, node.name, "alpha/tools", "ready")
        assert again["pid"] != first["pid"]
        left = [first["pid"]]
    else:
        await nc.close()
        if how == "node sigterm":
            assert await asyncio.to_thread(node.terminate, 20) == 0
        else:
            await asyncio.to_thread(node.kill)
        again = None
        left = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids + left):
        await asyncio.sleep(0.05)
    assert [p for p in pids + left if alive(p)] == []
    if again is not None:
        assert marked_processes(node.name) == [again["pid"]]
        await nc.close()
    else:
        assert marked_processes(node.name) == []


@pytest.mark.slow
async def test_child_ignoring_sigterm_is_killed_after_the_grace_period_when_the_node_stops(
    tmp_path: Path, node_factory
) -> None:
    grace = 2.0
    make_module(tmp_path / "mods", "stubborn", env={"RAW_MODE": "ignore_term"})
    make_module(tmp_path / "mods", "polite")
    node = node_factory(tmp_path / "mods", config=config(stop_grace_s=str(grace)))
    nc = await client(node.bus_url())
    stubborn = await wait_state(nc, node.name, "stubborn/tools", "ready")
    polite = await wait_state(nc, node.name, "polite/tools", "ready")
    await nc.close()
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(node.proc.wait, 30)
    took = time.monotonic() - started
    assert code == 0, node.log()
    # stdin closed, then `grace` s, SIGTERM (ignored), `grace` s, SIGKILL: it had its grace, no more.
    assert grace * 0.9 <= took <= 2 * grace + 6, f"the node took {took:.2f} s to stop"
    assert not alive(stubborn["pid"]) and not alive(polite["pid"])
    assert marked_processes(node.name) == []
    assert f"node {node.name} stopped" in node.log()


async def test_child_writing_one_long_answer_slowly_is_not_taken_for_dead(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=20000)
    node = node_factory(tmp_path / "mods")  # pings every 0.5 s, 2 misses of 0.5 s: ~2 s of silence is death
    nc = await client(node.bus_url())
    before = await wait_state(nc, node.name, "alpha/tools", "ready")
    code, body = await call(nc, "mesh.tool.alpha.trickle", {"seconds": 4, "chunks": 80}, timeout=20)
    assert code == 200, body
    assert len(body["content"][0]["text"]) == 80_000
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0
    await nc.close()


@pytest.mark.slow
async def test_a_40mb_answer_is_read_in_linear_time(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha", timeout_ms=60000)
    # Pings far apart: this is about the reading, not about liveness.
    # The object store's cap below 40 MB: this is about reading the line, not about storing it.
    node = node_factory(
        tmp_path / "mods",
        config=config(ping_interval_s="30", ping_timeout_s="30") + "[calls]\nobject_cap_bytes = 1048576\n",
    )
    nc = await client(node.bus_url())
    before = await wait_state(nc, node.name, "alpha/tools", "ready")
    started = time.monotonic()
    code, body = await call(nc, "mesh.tool.alpha.big", {"bytes": 40 * 1024 * 1024}, timeout=60)
    took = time.monotonic() - started
    assert code == 413 and body["error"]["cap"] == 1048576, body
    assert took < 5, f"a 40 MB answer took {took:.1f} s to read"
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0
    await nc.close()


async def test_a_call_waits_for_one_start_and_its_init_timeout_fails_it_at_once(tmp_path: Path, node_factory) -> None:
    """Issue 30 item 1: a start that never initializes costs a waiting call one init timeout, not two."""
    starts = tmp_path / "starts.log"
    make_module(tmp_path / "mods", "mute", env={"RAW_MODE": "no_init", "RAW_START_LOG": str(starts)}, timeout_ms=20000)
    # No backoff before the first restart (as by default): the restart comes right after the timeout.
    node = node_factory(tmp_path / "mods", config=config(init_timeout_s="3", backoff_initial_s="2"))
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "mute/tools", "starting")
    await wait_for(lambda: len(start_times(starts)) == 1, "the first start", timeout=10)

    sent = time.time()
    code, body = await call(nc, "mesh.tool.mute.echo", {}, timeout=25)
    answered = time.time()
    first = start_times(starts)[0]
    e = body["error"]
    assert code == 503, body
    # Answered at the first start's init timeout (3 s after it began), not after the restart's too.
    assert answered - first < 3 + 1.0, (answered - first, answered - sent, body)
    assert e["bundle"] == "mute/tools" and e["state"] == "starting", e
    assert "its start failed: did not complete the MCP handshake" in e["reason"], e
    assert "no answer to initialize within 3000 ms ([health] init_timeout_s)" in e["reason"], e
    assert "the node starts it again on its own" in e["reason"], e

    # The restart that follows is waited on by a call that comes after the failure, and only that one.
    await wait_for(lambda: len(start_times(starts)) == 2, "the restart", timeout=10)
    code, body = await call(nc, "mesh.tool.mute.echo", {}, timeout=25)
    answered = time.time()
    second = start_times(starts)[1]
    assert code == 503 and "its start failed" in body["error"]["reason"], body
    assert 3 - 0.5 < answered - second < 3 + 1.0, answered - second
    # In backoff after the second failure: at once.
    await wait_state(nc, node.name, "mute/tools", "backoff", timeout=10)
    began = time.monotonic()
    code, body = await call(nc, "mesh.tool.mute.echo", {}, timeout=25)
    assert code == 503 and body["error"]["state"] == "backoff" and time.monotonic() - began < 0.5, body
    await nc.close()
