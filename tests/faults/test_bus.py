"""The bus misbehaves or is large: payloads at and over its limit, a server restarted under
load, a node killed next to another serving the same module, a server of a cluster killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest

from runtime.bus.embedded import free_port
from tests.faults.conftest import call_retrying, config
from tests.support.mesh import bundle_status, call, client, make_module, status, wait_for, wait_state

MB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
async def test_10mb_request_on_a_bus_allowing_16mb_is_served(tmp_path: Path, servers, node_factory) -> None:
    server = servers("big", max_payload="16MB")
    make_module(tmp_path / "mods", "alpha", timeout_ms=60000)
    # Health checks at their defaults' pace: what a child's silence while it streams a large answer
    # costs is test_child_streaming_a_large_answer_is_not_taken_for_dead's subject, not this one's.
    node = node_factory(tmp_path / "mods", url=server.url, config=config(ping_interval_s="5", ping_timeout_s="5"))
    nc = await client(server.url)
    assert nc.max_payload == 16 * MB
    before = await wait_state(nc, node.name, "alpha/tools", "ready")
    args = {"blob": os.urandom(5 * MB).hex()}  # 10 MB of arguments, every byte checked on the way back
    body = json.dumps(args, separators=(",", ":")).encode()
    assert 10 * MB < len(body) < 16 * MB
    code, result = await call(nc, "mesh.tool.alpha.mirror", raw=body, timeout=60)
    assert code == 200, result
    assert result["content"][0]["text"] == f"{len(body)} {hashlib.sha256(body).hexdigest()}"
    assert result["structuredContent"] == args  # a 10 MB result fits too
    # echo gives the arguments back twice (text and structured): over 16 MB, so it is handed over
    # through the object store (docs/bus.md), and the child still serves.
    code, ref = await call(nc, "mesh.tool.alpha.echo", raw=body, timeout=60)
    assert code == 200 and ref["bucket"] == "mesh-calls" and ref["size"] > 16 * MB, ref
    code, result = await call(nc, "mesh.tool.alpha.echo", {"after": "10 MB"})
    assert code == 200 and result["structuredContent"] == {"after": "10 MB"}
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0
    # Over this bus's own limit: refused by the client before anything is sent.
    with pytest.raises(nats.errors.MaxPayloadError):
        await nc.request("mesh.tool.alpha.echo", b'{"x":"' + b"y" * (16 * MB) + b'"}', timeout=5)
    await nc.close()


async def test_10mb_request_on_a_default_bus_is_refused_by_the_client_at_once(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    assert nc.max_payload == 1 * MB
    body = b'{"blob":"' + b"x" * (10 * MB) + b'"}'
    started = time.monotonic()
    with pytest.raises(nats.errors.MaxPayloadError):
        await nc.request("mesh.tool.alpha.echo", body, timeout=10)
    assert time.monotonic() - started < 1.0
    # The connection is fine and the node never saw it.
    code, _ = await call(nc, "mesh.tool.alpha.echo", {"after": "refused"})
    assert code == 200
    assert (await bundle_status(nc, node.name, "alpha/tools"))["calls"] == 1
    await nc.close()


@pytest.mark.slow
async def test_nats_server_restarted_under_load_node_reconnects_and_no_call_is_answered_twice(
    tmp_path: Path, servers, node_factory
) -> None:
    port = free_port()
    first_server = servers("restarted", port=port)
    make_module(tmp_path / "mods", "alpha")
    node = node_factory(tmp_path / "mods", url=first_server.url)
    nc = await nats.connect(first_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    before = await wait_state(nc, node.name, "alpha/tools", "ready")

    # Every request has a reply subject of its own: <inbox>.<i>.<attempt>; count what each receives.
    inbox = nc.new_inbox()
    received: Counter[str] = Counter()
    replies: dict[str, Any] = {}
    arrived: dict[str, asyncio.Event] = {}

    async def on_reply(msg) -> None:
        received[msg.subject] += 1
        replies[msg.subject] = msg
        if msg.subject in arrived:
            arrived[msg.subject].set()

    await nc.subscribe(inbox + ".>", cb=on_reply)
    total, answered, retries = 300, {}, 0

    async def one(i: int) -> None:
        nonlocal retries
        for attempt in range(40):
            subject = f"{inbox}.{i}.{attempt}"
            arrived[subject] = asyncio.Event()
            try:
                await nc.publish("mesh.tool.alpha.echo", json.dumps({"i": i, "a": attempt}).encode(), reply=subject)
                await asyncio.wait_for(arrived[subject].wait(), 1.5)
            except (TimeoutError, nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError):
                retries += 1
                await asyncio.sleep(0.1)
                continue
            msg = replies[subject]
            # A runtime error, or the server's own "no responders" (status 503, no body) while the
            # node is not yet subscribed again after the restart: try again.
            if msg.headers and ("Nats-Service-Error-Code" in msg.headers or msg.headers.get("Status") == "503"):
                retries += 1
                await asyncio.sleep(0.1)
                continue
            answered[i] = json.loads(msg.data)
            return

    async def worker(w: int) -> None:
        for i in range(w, total, 5):
            await one(i)

    workers = asyncio.gather(*(worker(w) for w in range(5)))
    await wait_for(lambda: len(answered) >= 60, "60 calls answered before the restart", timeout=30)
    first_server.kill()
    await asyncio.sleep(1.0)
    servers("restarted", port=port)  # a new process on the same port (and the same JetStream folder)
    await asyncio.wait_for(workers, 120)
    await asyncio.sleep(1.0)  # room for a late duplicate to arrive

    assert sorted(answered) == list(range(total))
    # Each answer went to the request it belongs to: its reply subject names the same call.
    for subject, msg in replies.items():
        if not msg.headers:
            i, attempt = map(int, subject.rsplit(".", 2)[1:])
            assert json.loads(msg.data)["structuredContent"] == {"i": i, "a": attempt}, subject
    twice = {s: n for s, n in received.items() if n > 1}
    assert not twice, f"reply subjects that received more than one answer: {twice}"
    # The node rode over it: same process, same child, no restart, and it says it reconnected.
    assert node.proc.poll() is None
    st = await status(nc, node.name)
    assert st["pid"] == node.proc.pid
    b = await bundle_status(nc, node.name, "alpha/tools")
    assert b["pid"] == before["pid"] and b["restarts"] == 0
    assert "reconnected to the bus" in node.log() and "Traceback" not in node.log()
    assert retries < total, f"{retries} retries for {total} calls"
    await nc.close()


async def _whoami(nc, per_try: float = 0.5) -> tuple[int, Any, int]:
    return await call_retrying(nc, "mesh.tool.alpha.whoami", {}, per_try=per_try, tries=20, pause=0.05)


@pytest.mark.slow
async def test_two_nodes_serving_one_module_one_killed_calls_go_on(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "a", "alpha")
    make_module(tmp_path / "b", "alpha")
    a = node_factory(tmp_path / "a")
    b = node_factory(tmp_path / "b")
    nc = await client(a.bus_url())
    await wait_state(nc, a.name, "alpha/tools", "ready")
    await wait_state(nc, b.name, "alpha/tools", "ready")
    served: Counter[str] = Counter()
    for _ in range(40):
        code, r, _ = await _whoami(nc)
        assert code == 200
        served[r["structuredContent"]["node"]] += 1
    assert served[a.name] > 0 and served[b.name] > 0, served  # the queue group shares the load

    # Four callers keep going while node A is killed.
    log: list[tuple[float, int, int, str]] = []  # (started, code, tries, node)
    stop = asyncio.Event()

    async def caller() -> None:
        while not stop.is_set():
            started = time.monotonic()
            code, r, tries = await _whoami(nc)
            log.append((started, code, tries, r["structuredContent"]["node"] if code == 200 else ""))

    callers = [asyncio.create_task(caller()) for _ in range(4)]
    await asyncio.sleep(1.0)
    killed_at = time.monotonic()
    await asyncio.to_thread(a.kill)
    # Until 40 calls that started a second after the kill have been answered (not a fixed 4 s).
    await wait_for(lambda: len([e for e in log if e[0] > killed_at + 1.0]) >= 40, "40 calls after the kill", timeout=30)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*callers), 30)

    assert all(code == 200 for _, code, _, _ in log), [e for e in log if e[1] != 200][:5]
    after = [e for e in log if e[0] > killed_at + 1.0]
    assert len(after) > 20
    # A second after the kill every call succeeds at the first try, answered by B.
    assert all(tries == 1 and who == b.name for _, _, tries, who in after), [e for e in after if e[2] > 1][:5]
    retried = sum(tries - 1 for _, _, tries, _ in log)
    assert retried <= 8, f"{retried} retries around the kill (4 callers)"
    await nc.close()


@pytest.mark.slow
async def test_cluster_server_killed_under_a_node_calls_go_on(tmp_path: Path, servers, node_factory) -> None:
    ports, cports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    s1, s2, s3 = (
        servers(
            f"s{k + 1}",
            run=False,
            port=ports[k],
            jetstream=False,
            cluster_port=cports[k],
            routes=[p for j, p in enumerate(cports) if j != k],
        )
        for k in range(3)
    )
    # Node A is given all three URLs while only s1 runs, so it is on s1; then the cluster forms.
    s1.start()
    make_module(tmp_path / "a", "alpha")
    make_module(tmp_path / "b", "alpha")
    a = node_factory(tmp_path / "a", url=",".join(s.url for s in (s1, s2, s3)))
    assert f"mesh-node:{a.name}" in s1.client_names()
    s2.start()
    s3.start()
    for s in (s1, s2, s3):
        await wait_for(lambda s=s: len(s.peers()) == 2, f"{s.name} routed to both others", timeout=20)  # type: ignore[misc]
    b = node_factory(tmp_path / "b", url=s2.url)
    nc = await client(s3.url)
    a_child = await wait_state(nc, a.name, "alpha/tools", "ready")
    await wait_state(nc, b.name, "alpha/tools", "ready")
    served: Counter[str] = Counter()
    for _ in range(40):
        code, r, _ = await _whoami(nc, per_try=1.0)
        assert code == 200
        served[r["structuredContent"]["node"]] += 1
    assert served[a.name] > 0 and served[b.name] > 0, served

    log: list[tuple[float, int, int, str]] = []
    stop = asyncio.Event()

    async def caller() -> None:
        while not stop.is_set():
            started = time.monotonic()
            code, r, tries = await _whoami(nc, per_try=1.0)
            log.append((started, code, tries, r["structuredContent"]["node"] if code == 200 else ""))

    callers = [asyncio.create_task(caller()) for _ in range(4)]
    await asyncio.sleep(1.0)
    killed_at = time.monotonic()
    s1.kill()
    a.wait_log("reconnected to the bus", timeout=20)
    await wait_for(
        lambda: len([e for e in log if e[0] > killed_at + 2.0]) >= 40, "40 calls after the fail-over", timeout=30
    )
    stop.set()
    await asyncio.wait_for(asyncio.gather(*callers), 60)

    assert all(code == 200 for _, code, _, _ in log), [e for e in log if e[1] != 200][:5]
    after = [e for e in log if e[0] > killed_at + 2.0]
    assert len(after) > 20 and all(tries == 1 for _, _, tries, _ in after), [e for e in after if e[2] > 1][:5]
    # Node A failed over to another server of the cluster and serves again: same process, same child.
    assert any(f"mesh-node:{a.name}" in s.client_names() for s in (s2, s3))

    async def a_answers() -> bool:
        code, r, _ = await _whoami(nc, per_try=1.0)
        return code == 200 and r["structuredContent"]["node"] == a.name

    await wait_for(a_answers, "node A answers calls again", timeout=20, every=0.01)
    assert a.proc.poll() is None
    again = await bundle_status(nc, a.name, "alpha/tools")
    assert again["pid"] == a_child["pid"] and again["restarts"] == 0
    await nc.close()


def _node_connections(server: Any, node: str) -> dict[str, int]:
    """The node's connections at the server, by name: its own, and one lane per served group."""
    prefix = f"mesh-node:{node}"
    return {
        c["name"]: c["cid"]
        for c in server.monitor("connz?limit=1024")["connections"]
        if (c.get("name") or "").startswith(prefix)
    }


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.slow
async def test_a_flood_at_one_bundle_costs_no_call_of_another_and_not_the_nodes_connection(
    tmp_path: Path, servers, node_factory
) -> None:
    """Issue 30 item 2: 600 calls of 900 KB at once at a bundle with max_in_flight = 1 whose slot is
    held, while another bundle of the same node is called all along: every one of those calls is
    answered, the node's connection to the bus and the other module's stay the same connections."""
    server = servers("flood", jetstream=True)
    make_module(tmp_path / "mods", "slow", timeout_ms=30000, extra_bundle="max_in_flight = 1")
    make_module(tmp_path / "mods", "good", timeout_ms=30000)
    node = node_factory(tmp_path / "mods", url=server.url)
    nc = await client(server.url)
    await wait_state(nc, node.name, "slow/tools", "ready")
    await wait_state(nc, node.name, "good/tools", "ready")
    before = _node_connections(server, node.name)
    own, good_lane = f"mesh-node:{node.name}", f"mesh-node:{node.name}:mesh.tool.good.>"
    assert own in before and good_lane in before, before

    holder = asyncio.create_task(call(nc, "mesh.tool.slow.sleep", {"seconds": 6}, timeout=30))
    await wait_for(lambda: bundle_status(nc, node.name, "slow/tools"), "the slot held", ok=lambda b: b["in_flight"])
    flooder = await client(server.url)
    body = b'{"pad":"' + b"x" * (900 * 1024) + b'"}'
    done = asyncio.Event()
    peak = [0.0]
    # The other bundle's caller is a process of its own: the flood below is sent from this test's
    # event loop, which it starves (a call made from here was seen late by 3.4 s past its timeout).
    steady = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.steady_caller",
        server.url,
        "mesh.tool.good.echo",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    assert steady.stdout and steady.stdin
    assert json.loads(await asyncio.wait_for(steady.stdout.readline(), 20)) == {"ready": True}

    async def watch_rss() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb(node.proc.pid))
            await asyncio.sleep(0.05)

    async def one() -> tuple[int | str, Any]:
        try:
            return await call(flooder, "mesh.tool.slow.mirror", raw=body, timeout=20)
        except Exception as e:
            return repr(e), None

    watchers = [asyncio.create_task(watch_rss())]
    began = time.monotonic()
    answers = await asyncio.gather(*[one() for _ in range(600)])
    took = time.monotonic() - began
    done.set()
    await asyncio.gather(*watchers)
    steady.stdin.close()
    out, _ = await asyncio.wait_for(steady.communicate(), 30)
    good = [
        (g["code"] if g["ok"] else f"{g['code']}: {g.get('body')}", g["s"]) for g in map(json.loads, out.splitlines())
    ]
    assert (await holder)[0] == 200

    kinds = Counter(
        f"{code} {b['error']['kind']}" if isinstance(b, dict) and "error" in b else str(code) for code, b in answers
    )
    after = _node_connections(server, node.name)
    flood_lane = f"mesh-node:{node.name}:mesh.tool.slow.>"
    dropped = before.get(flood_lane) != after.get(flood_lane)
    print(
        f"600 calls of 900 KB in {took:.1f} s: {dict(kinds)}; node peak RSS {peak[0]:.0f} MB; "
        f"{len(good)} calls to the other bundle meanwhile, slowest {max(t for _, t in good):.2f} s; "
        f"the flooded module's lane {'was dropped by the server and came back' if dropped else 'held'}"
    )
    lost = [g for g in good if g[0] != 200]
    assert good and not lost, f"{len(lost)} of {len(good)} calls to the other bundle failed: {lost[:5]}"
    # The node's own connection and the other module's lane are the ones from before the flood.
    assert after.get(own) == before[own] and after.get(good_lane) == before[good_lane], (before, after)
    assert "disconnected from the bus" not in node.log()
    if not dropped:  # the flood's lane held: every flood call was read and answered
        assert sum(kinds[k] for k in kinds if k.startswith(("200", "503"))) == 600, kinds
    assert kinds["503 overloaded"] >= 300, kinds
    # The flooded module serves again (its lane back, if the server had dropped it).
    code, _, _ = await call_retrying(nc, "mesh.tool.slow.echo", {"after": 1}, per_try=2, tries=20, pause=0.25)
    assert code == 200
    await flooder.close()
    await nc.close()
