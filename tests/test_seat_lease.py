"""Stateful seats held by a lease, with real node processes on a real nats-server: one holder
when two nodes start at the same instant; a holder killed or stopped never replaced by a node
with an empty store (503 naming the seat, the holder and the ways out); a replicated seat
taken over by itself; an operator's `meshctl seat adopt`."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from tests.faults.security_support import ConfiguredServer, meshctl
from tests.support.mesh import (
    FAST_CONFIG,
    NatsServer,
    NodeProcess,
    bundle_status,
    client,
    make_module,
    status,
    wait_state,
)

TTL_S = 3
CONFIG = FAST_CONFIG + f"\n[seats]\nlease_ttl_s = {TTL_S}\n"


def store_module(root: Path, failover: str | None = None) -> Path:
    """A module `store` holding the stateful seat `echo` (raw child: seat verb echo.say, tool remember)."""
    folder = make_module(root, "store", seats=["echo"])
    if failover:
        with open(folder / "module.toml", "a") as f:
            f.write(f'failover = "{failover}"\n')
    return root


def start(tmp_path: Path, mods: Path, url: str, name: str) -> NodeProcess:
    return NodeProcess(tmp_path, mods, url, name, config=CONFIG)


class Pair:
    """Nodes a and b (a first, so a holds) on one bus, with a client; all ended by `close`."""

    def __init__(self, tmp_path: Path, mods: Path, url: str) -> None:
        self.tmp_path, self.mods, self.url = tmp_path, mods, url
        self.a = start(tmp_path, mods, url, "a")
        self.a.wait_log("serving on")
        self.b = start(tmp_path, mods, url, "b")
        self.b.wait_log("serving on")

    async def __aenter__(self) -> Pair:
        self.nc = await client(self.url)
        # a holds the seat: b's bundle is on standby (its child not started), never `ready`.
        await wait_state(self.nc, "b", "store/tools", "standby")
        await wait_state(self.nc, "a", "store/tools", "ready")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()
        self.a.kill()
        self.b.kill()


async def seat_of(nc: Client, node: str) -> dict[str, Any]:
    seats = (await status(nc, node))["seats"]
    assert len(seats) == 1, seats
    return seats[0]


async def answer(nc: Client, subject: str, args: dict[str, Any] | None = None, timeout: float = 5) -> tuple[int, Any]:
    """(code, body); 0 when nobody answered at all (no responders)."""
    try:
        msg = await nc.request(subject, json.dumps(args or {}).encode(), timeout=timeout)
    except nats.errors.NoRespondersError:
        return 0, None
    code = int((msg.headers or {}).get("Nats-Service-Error-Code", 200))
    return code, json.loads(msg.data)


async def wait_answer(nc: Client, subject: str, want: int, timeout: float, args: dict[str, Any] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    seen: list[int | str] = []
    while time.monotonic() < deadline:
        # Right after a SIGKILL the server may still hand a request to the dead node's subscription
        # (CI saw one such request time out after 5 s): that try is "no answer", and the next one
        # goes on within the deadline.
        try:
            code, body = await answer(nc, subject, args, timeout=max(0.5, min(2.0, deadline - time.monotonic())))
        except nats.errors.TimeoutError:
            seen.append("timeout")
            continue
        if code == want:
            return body
        seen.append(code)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{subject} never answered {want} within {timeout} s; answers: {seen[-10:]}")


def assert_seat_503(body: dict[str, Any], holder: str, node: str) -> None:
    error = body["error"]
    assert error["kind"] == "seat_unavailable" and error["seat"] == "echo" and error["holder"] == holder
    assert error["node"] == node and "empty store" in error["message"]
    assert any(f"start node {holder} again" in w for w in error["ways_out"]), error["ways_out"]
    assert any(f"meshctl seat adopt echo --node {node}" in w for w in error["ways_out"]), error["ways_out"]


@pytest.mark.slow
async def test_two_nodes_started_at_the_same_instant_one_holder_twenty_times(tmp_path: Path) -> None:
    mods = store_module(tmp_path / "mods")
    for round_ in range(20):
        server = NatsServer(tmp_path / f"nats{round_}").start()
        nodes = [start(tmp_path, mods, server.url, f"r{round_}a"), start(tmp_path, mods, server.url, f"r{round_}b")]
        try:
            for node in nodes:
                node.wait_log("serving on", timeout=30)
            nc = await client(server.url)
            seats = {n.name: await seat_of(nc, n.name) for n in nodes}
            held = [name for name, s in seats.items() if s["state"] == "held"]
            assert len(held) == 1, f"round {round_}: {seats}"
            (other,) = [name for name in seats if name != held[0]]
            assert seats[other]["state"] == "elsewhere" and seats[other]["holder"] == held[0], seats
            code, body = await answer(nc, "mesh.tool.store.whoami")
            assert code == 200 and body["structuredContent"]["node"] == held[0]
            await nc.close()
        finally:
            for node in nodes:
                node.kill()
            server.stop()


async def test_holder_killed_calls_get_503_never_an_empty_store_then_it_comes_back(tmp_path: Path, nats_server) -> None:
    mods = store_module(tmp_path / "mods")
    async with Pair(tmp_path, mods, nats_server.url) as pair:
        a, b, nc = pair.a, pair.b, pair.nc
        code, body = await answer(nc, "mesh.tool.store.remember", {"key": "k", "value": "kept on a"})
        assert code == 200 and body["structuredContent"] == {"k": "kept on a"}
        assert (await seat_of(nc, "b"))["holder"] == "a"
        a.kill()  # SIGKILL: its lease lives on until it expires
        body = await wait_answer(nc, "mesh.seat.echo.say", 503, timeout=5)
        assert_seat_503(body, "a", "b")
        assert "does not answer" in body["error"]["message"]
        # Until well past the lease's life, every call is refused: nothing lands in b's empty store.
        deadline = time.monotonic() + TTL_S + 2
        while time.monotonic() < deadline:
            for subject in ("mesh.seat.echo.say", "mesh.tool.store.remember"):
                code, body = await answer(nc, subject, {"key": "k", "value": "lost"})
                assert code == 503, (subject, code, body)
                assert_seat_503(body, "a", "b")
            await asyncio.sleep(0.2)
        seat = await seat_of(nc, "b")
        assert seat["state"] == "refused" and seat["home"] == "a", seat
        b_bundle = await bundle_status(nc, "b", "store/tools")
        assert b_bundle["calls"] == 0 and b_bundle["state"] == "standby", b_bundle
        b_log = b.log()
        assert b_log.count("seat echo: not served by module store on node b") <= 3  # said on each change, not per call
        assert "keeps its data on node a's disk" in b_log
        # The holder comes back with its disk: it takes the seat again, its data with it.
        a = pair.a = start(tmp_path, mods, nats_server.url, "a")
        a.wait_log("serving on")
        body = await wait_answer(nc, "mesh.tool.store.remember", 200, timeout=10)
        assert body["structuredContent"] == {"k": "kept on a"}
        assert (await seat_of(nc, "a"))["state"] == "held"


async def test_holder_stopped_cleanly_the_other_does_not_serve_until_an_operator_says(
    tmp_path: Path, nats_server
) -> None:
    mods = store_module(tmp_path / "mods")
    async with Pair(tmp_path, mods, nats_server.url) as pair:
        a, _b, nc = pair.a, pair.b, pair.nc
        url = ["--nats", nats_server.url]
        shown = meshctl("node", "status", "--name", "b", *url)
        assert "seat echo: held by node a, not here (module store)" in shown.stdout, shown.stdout
        assert [line.split()[4] for line in shown.stdout.splitlines() if line.startswith("store/tools")] == [
            "standby"
        ], shown.stdout
        listed = meshctl("seat", "list", "--json", *url)
        row = json.loads(listed.stdout)[0]
        assert {k: row.get(k) for k in ("seat", "holder", "module", "home", "home_how")} == {
            "seat": "echo",
            "holder": "a",
            "module": "store",
            "home": "a",
            "home_how": "first holder",
        }, row
        assert {"store", "replica", "last_sync", "lag_s"} <= set(row), row
        assert a.terminate() == 0
        assert "seat echo: lease released by node a" in a.log()
        body = await wait_answer(nc, "mesh.seat.echo.say", 503, timeout=5)
        assert_seat_503(body, "a", "b")
        assert "its data lives on node a's disk" in body["error"]["message"]
        await asyncio.sleep(1.5)
        assert (await answer(nc, "mesh.seat.echo.say"))[0] == 503
        shown = meshctl("node", "status", "--name", "b", *url)
        assert "seat echo: refused for module store" in shown.stdout and "node a's disk" in shown.stdout
        # The operator's word: b's data is the seat's now. b takes it.
        adopted = meshctl("seat", "adopt", "echo", "--node", "b", *url)
        assert adopted.returncode == 0 and "its data is node b's now (was a)" in adopted.stdout, adopted.stderr
        body = await wait_answer(nc, "mesh.seat.echo.say", 200, timeout=5, args={"who": "b"})
        assert body["structuredContent"] == {"who": "b"}
        assert (await seat_of(nc, "b"))["state"] == "held"
        # Adopting a seat somebody holds is refused, naming the holder.
        refused = meshctl("seat", "adopt", "echo", "--node", "a", *url)
        assert refused.returncode == 1 and "node b holds seat echo now" in refused.stderr


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_a_replicated_seat_is_taken_over_by_a_live_node(tmp_path: Path, nats_server, how: str) -> None:
    mods = store_module(tmp_path / "mods", failover="replicated")
    async with Pair(tmp_path, mods, nats_server.url) as pair:
        a, _b, nc = pair.a, pair.b, pair.nc
        assert (await seat_of(nc, "b"))["holder"] == "a"
        started = time.monotonic()
        if how == "sigterm":
            assert a.terminate() == 0
        else:
            a.kill()
        body = await wait_answer(nc, "mesh.seat.echo.say", 200, timeout=TTL_S * 3 + 10, args={"who": "b"})
        took = time.monotonic() - started
        assert body["structuredContent"] == {"who": "b"}
        assert (await seat_of(nc, "b"))["state"] == "held"
        assert (await bundle_status(nc, "b", "store/tools"))["state"] == "ready"  # standby no more
        if how == "sigterm":
            assert took < TTL_S, f"a released lease is taken at once, not after its life ({took:.1f} s)"


async def test_seat_move_takes_the_data_with_the_seat(tmp_path: Path, nats_server) -> None:
    mods = store_module(tmp_path / "mods")
    async with Pair(tmp_path, mods, nats_server.url) as pair:
        _a, b, nc = pair.a, pair.b, pair.nc
        url = ["--nats", nats_server.url]
        code, _ = await answer(nc, "mesh.tool.store.remember", {"key": "k", "value": "kept on a"})
        assert code == 200
        moved = meshctl("seat", "move", "echo", "--to", "b", "--timeout", "30", *url, timeout=60)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "data moved from node a to node b" in moved.stdout and "node b holds seat echo now" in moved.stdout
        code, body = await answer(nc, "mesh.tool.store.remember")
        assert code == 200 and body["structuredContent"] == {"k": "kept on a"}
        for _ in range(10):  # a has stopped answering: every call is b's
            code, body = await answer(nc, "mesh.tool.store.whoami")
            assert code == 200 and body["structuredContent"]["node"] == "b"
        seat_a = await seat_of(nc, "a")
        assert seat_a["state"] == "elsewhere" and seat_a["holder"] == "b", seat_a
        # Nothing stays live on the old home: its folder is moved aside (b, a standby, had none of its own).
        assert not (_a.state_dir / "data" / "store").exists(), list((_a.state_dir / "data").iterdir())
        assert list((_a.state_dir / "data").glob("store.stale-*")), list((_a.state_dir / "data").iterdir())
        assert "seat echo: data taken in (moved from a, " in b.log(), b.log()
        # A move needs its data's node running: asked of a dead one, it says so and what else to do.
        b.kill()
        refused = meshctl("seat", "move", "echo", "--to", "a", *url)
        assert refused.returncode == 1
        assert "node b holds seat echo's data and does not run" in refused.stderr
        assert "meshctl seat adopt echo --node a" in refused.stderr


async def test_a_bus_without_jetstream_refuses_the_stateful_seat_and_serves_the_rest(tmp_path: Path) -> None:
    server = ConfiguredServer(tmp_path / "bus", "", jetstream=False).start()
    mods = store_module(tmp_path / "mods")
    make_module(mods, "plain")
    node = NodeProcess(
        tmp_path,
        mods,
        server.url,
        "nojs",
        config=CONFIG.replace("drain_timeout_s", "membership = false\ndrain_timeout_s"),
    )
    try:
        node.wait_log("serving on", timeout=20)
        nc = await client(server.url)
        seat = await seat_of(nc, "nojs")
        assert seat["state"] == "refused" and "needs JetStream" in seat["reason"], seat
        # No lease, no store: its child is not even started.
        assert not (await wait_state(nc, "nojs", "store/tools", "standby"))["pid"]
        await wait_state(nc, "nojs", "plain/tools", "ready")
        code, body = await answer(nc, "mesh.tool.plain.echo", {"x": 1})
        assert code == 200
        code, _ = await answer(nc, "mesh.tool.store.echo")  # shares the seat's store: not served
        assert code != 200
        await nc.close()
    finally:
        node.kill()
        server.stop()
