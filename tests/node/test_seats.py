"""Seats on real nodes in this process: stateless seats, a second claimant refused, a stateful seat
held through its lease by one of two nodes in one account, the other on standby naming the holder,
a clean stop releasing the lease, the local-failover home rule (503 with ways out, never an empty
store), a replicated seat taken over, an operator's adopt, and a seat move with its data.

Ported from tests/test_node.py, tests/test_seat_lease.py and tests/test_seat_ready.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec

from runtime.bus.service_api import collect_infos
from runtime.config import SeatsConfig
from runtime.meshctl.seats import adopt
from runtime.wire.control import SeatMoveAsk, SeatMoveReply, SeatStatus
from runtime.wire.leases import SeatLeases
from runtime.wire.subjects import SEAT_MOVE, node_subject
from tests.support.fake_child import Behaviour, FakeChild, Script, echo
from tests.support.inproc import Mesh, code_of, module_folder, placement, until

SEATS = SeatsConfig(lease_ttl_s=1.5)  # a keeper looks every 0.5 s
MEMORY = '[[seat]]\nname = "memory"\n'
STORE_TOOLS = ("memory.get", "remember")


def store(tmp_path: Path, node: str, failover: str = "") -> Path:
    """Module `store`, holding the stateful seat `memory` (verb memory.get; own tool remember)."""
    seat = MEMORY + (f'failover = "{failover}"\n' if failover else "")
    return module_folder(tmp_path / node, "store", seats=seat)


async def pair(m: Mesh, tmp_path: Path, script: Script, failover: str = "") -> None:
    """Nodes a (first: it holds the seat) and b (standby) serving module store."""
    script.modules["store"] = [Behaviour(answer=echo, tools=STORE_TOOLS)]
    await m.start("a", store(tmp_path, "a", failover), seats=SEATS)
    await m.bundle_state("a", "store/tools", "ready")
    await m.start("b", store(tmp_path, "b", failover), seats=SEATS)
    await m.bundle_state("b", "store/tools", "standby")


def child_of(script: Script, node: str) -> list[FakeChild]:
    return [c for c in script.of("store") if c.spec is not None and c.spec.env.get("MESH_NODE") == node]


async def seat_of(m: Mesh, node: str) -> SeatStatus:
    [seat] = (await m.status(node)).seats
    return seat


async def answer(m: Mesh, subject: str, want: str | None, timeout: float = 8) -> dict[str, Any]:
    """The first answer on `subject` with code `want` (None: a result); no responders is "not yet"."""

    async def once() -> dict[str, Any] | None:
        try:
            msg = await m.nc.request(subject, b"{}", timeout=2)
        except Exception:  # no responders while nobody serves the seat
            return None
        return json.loads(msg.data) if code_of(msg) == want else None

    return await until(once, f"{subject} answering {want or 'a result'}", timeout=timeout, every=0.02)


def assert_seat_503(body: dict[str, Any], holder: str, node: str) -> None:
    e = body["error"]
    assert (e["kind"], e["seat"], e["holder"], e["node"]) == ("seat_unavailable", "memory", holder, node), e
    assert "empty store" in e["message"]
    assert any(f"start node {holder} again" in w for w in e["ways_out"]), e["ways_out"]
    assert any(f"meshctl seat adopt memory --node {node}" in w for w in e["ways_out"]), e["ways_out"]


# --- one node ------------------------------------------------------------------------------------
async def test_a_stateless_seat_is_held_and_its_verb_served_only_on_the_seat_subject(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["timer"] = [Behaviour(answer=echo, tools=("clock.now", "greet"))]
    await m.start("n1", module_folder(tmp_path, "timer", seats='[[seat]]\nname = "clock"\nstateless = true\n'))
    status = await m.bundle_state("n1", "timer/tools", "ready")
    assert status.seats == [SeatStatus("clock", "timer", "held")]
    result, code = await m.call("mesh.seat.clock.now", {"tz": "UTC"})
    assert code is None and result["content"][0]["text"] == 'clock.now: {"tz": "UTC"}'
    body, code = await m.call("mesh.tool.timer.clock.now", {})
    assert code == "404" and "mesh.tool.timer.clock.now" not in body["error"]["known"]
    body, code = await m.call("mesh.seat.clock.nope", {})
    assert code == "404" and "seat clock has no verb 'nope' (held by module timer)" in body["error"]["message"]


async def test_a_verb_of_a_seat_the_module_does_not_declare_is_a_problem_and_a_404_with_the_way_out(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["alpha"] = [Behaviour(answer=echo, tools=("memory.get", "greet"))]
    await m.start("n1", module_folder(tmp_path, "alpha"))
    status = await m.bundle_state("n1", "alpha/tools", "ready")
    [problem] = status.problems
    assert "tool 'memory.get' is a verb of seat 'memory', which the module does not declare" in problem
    body, code = await m.call("mesh.tool.alpha.memory.get", {})
    assert code == "404" and body["error"]["ways_out"] == [
        'Add [[seat]] name = "memory" to its module.toml, or rename the tool without a dot'
    ]
    _, code = await m.call("mesh.tool.alpha.greet", {})  # its other tools serve
    assert code is None


async def test_a_second_module_claiming_a_seat_on_the_same_node_is_refused(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    echo_seat = '[[seat]]\nname = "echo"\nstateless = true\n'
    for module in ("first", "second"):
        script.modules[module] = [Behaviour(answer=echo, tools=("echo.say",))]
    await m.start(
        "n1", module_folder(tmp_path, "first", seats=echo_seat), module_folder(tmp_path, "second", seats=echo_seat)
    )
    status = await m.bundle_state("n1", "second/tools", "ready")
    assert [(s.seat, s.module, s.state) for s in status.seats] == [
        ("echo", "first", "held"),
        ("echo", "second", "refused"),
    ]
    assert "module first already holds seat echo on node n1; one holder per seat per node" in status.seats[1].reason
    for i in range(5):
        _, code = await m.call("mesh.seat.echo.say", {"i": i})
        assert code is None
    assert len(script.of("first")[0].calls()) == 5 and script.of("second")[0].calls() == []
    _, code = await m.call("mesh.tool.second.echo.say", {})
    assert code == "404"


async def test_two_modules_claiming_one_stateful_seat_on_one_node_one_holds_it(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    for module in ("first", "second"):
        script.modules[module] = [Behaviour(answer=echo, tools=("memory.get",))]
    await m.start(
        "n1",
        module_folder(tmp_path, "first", seats=MEMORY),
        module_folder(tmp_path, "second", seats=MEMORY),
        seats=SEATS,
    )
    status = await m.bundle_state("n1", "first/tools", "ready")
    states = sorted((s.module, s.state) for s in status.seats)
    assert states == [("first", "held"), ("second", "refused")], status.seats
    _, code = await m.call("mesh.seat.memory.get", {})
    assert code is None and len(script.of("first")[0].calls()) == 1


async def test_a_bundle_shown_ready_answers_its_seat_verb_and_own_tools_at_once(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["store"] = [Behaviour(answer=echo, tools=STORE_TOOLS)]
    await m.start("a", store(tmp_path, "a"), seats=SEATS)
    status = await m.bundle_state("a", "store/tools", "ready")
    assert [(s.seat, s.state) for s in status.seats] == [("memory", "held")]
    for subject in ("mesh.seat.memory.get", "mesh.tool.store.remember"):
        _, code = await m.call(subject, {})  # never "no responders"
        assert code is None, subject


# --- two nodes, one lease ----------------------------------------------------------------------------
async def test_one_node_holds_the_stateful_seat_the_other_stands_by_naming_it(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    seat = await seat_of(m, "b")
    assert (seat.state, seat.holder, seat.module) == ("elsewhere", "a", "store")
    assert "node a holds seat memory (module store)" in seat.reason
    assert (await seat_of(m, "a")).state == "held"
    # The module's own tools share the seat's store: only the holder answers them, and the seat's verb.
    for subject in ["mesh.tool.store.remember"] * 5 + ["mesh.seat.memory.get"] * 5:
        _, code = await m.call(subject, {})
        assert code is None
    # b runs no child of the module at all: no store where the seat is not held.
    assert len(child_of(script, "a")[0].calls()) == 10 and child_of(script, "b") == []
    leases = await SeatLeases.open(m.nc, 1.5)
    lease = await leases.read("memory")
    assert lease is not None and lease.record.node == "a"


async def test_a_clean_stop_releases_the_lease_and_the_standby_answers_503_with_ways_out(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    await m.stop("a")
    assert await (await SeatLeases.open(m.nc, 1.5)).read("memory") is None  # released, not left to expire
    body = await answer(m, "mesh.seat.memory.get", "503")
    assert_seat_503(body, holder="a", node="b")
    assert "its data lives on node a's disk" in body["error"]["message"]
    assert any("meshctl seat move memory --to b" in w for w in body["error"]["ways_out"])
    body = await answer(m, "mesh.tool.store.remember", "503")  # its own tools share the store: refused too
    assert_seat_503(body, holder="a", node="b")
    seat = await seat_of(m, "b")
    assert (seat.state, seat.home) == ("refused", "a") and "keeps its data on node a's disk" in seat.reason
    assert child_of(script, "b") == [] and (await m.status("b")).bundle("store/tools").state == "standby"  # type: ignore[union-attr]


async def test_a_killed_holder_is_named_silent_and_no_call_lands_in_the_empty_store(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    await m.kill("a")  # its lease lives on until it expires
    body = await answer(m, "mesh.seat.memory.get", "503")
    assert_seat_503(body, holder="a", node="b")
    # While its lease lives, a is named silent (on a loaded machine b may first look after it expired).
    assert "does not answer" in body["error"]["message"] or "lives on node a's disk" in body["error"]["message"]
    # Past the lease's life too: the data is a's, b's store stays empty.
    await until(lambda: _refused_home(m, "b", "a"), "b naming a's disk as the seat's home", timeout=8)
    body, code = await m.call("mesh.tool.store.remember", {})
    assert code == "503" and "its data lives on node a's disk" in body["error"]["message"]
    assert child_of(script, "b") == []


async def _refused_home(m: Mesh, node: str, home: str) -> bool:
    seat = await seat_of(m, node)
    return seat.state == "refused" and seat.home == home


async def test_the_holder_back_with_its_disk_takes_the_seat_again(tmp_path: Path, m: Mesh, script: Script) -> None:
    await pair(m, tmp_path, script)
    await m.stop("a")
    await answer(m, "mesh.seat.memory.get", "503")
    await m.start("a", store(tmp_path, "a"), seats=SEATS)
    await answer(m, "mesh.seat.memory.get", None)
    assert (await seat_of(m, "a")).state == "held"
    await until(lambda: _elsewhere(m, "b", "a"), "b standing by for a again")


async def _elsewhere(m: Mesh, node: str, holder: str) -> bool:
    seat = await seat_of(m, node)
    return seat.state == "elsewhere" and seat.holder == holder


async def test_an_operators_adopt_lets_the_standby_take_the_seat(tmp_path: Path, m: Mesh, script: Script) -> None:
    await pair(m, tmp_path, script)
    await m.stop("a")
    await answer(m, "mesh.seat.memory.get", "503")
    record, before = await adopt(m.nc, "memory", "b")
    assert (record.node, before) == ("b", "a") and "adopted by an operator (was a)" == record.how
    await answer(m, "mesh.seat.memory.get", None)

    async def held() -> SeatStatus | None:
        seat = await seat_of(m, "b")
        return seat if seat.state == "held" else None

    # The seat's subject answers a moment before the status says held: status waits until the
    # module's own tools are subscribed too (runtime/seats/seats.py changed()); seen 1 run in 5.
    await until(held, "b's status saying the seat is held", timeout=8, every=0.02)
    assert (await m.status("b")).bundle("store/tools").state == "ready"  # type: ignore[union-attr]


async def test_a_replicated_seat_is_taken_over_at_once_when_its_holder_stops_cleanly(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script, failover="replicated")
    await m.stop("a")
    await m.bundle_state("b", "store/tools", "ready")
    assert (await seat_of(m, "b")).state == "held"
    _, code = await m.call("mesh.seat.memory.get", {"who": "b"})
    assert code is None and len(child_of(script, "b")[0].calls()) == 1


async def test_a_seat_move_takes_the_data_to_the_other_node_which_then_holds_it(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    (m.tmp / "state-a" / "data" / "store" / "kept.txt").write_text("kept on a")
    (m.tmp / "state-b" / "data" / "store").mkdir(parents=True)  # b, on standby, made no folder of its own
    (m.tmp / "state-b" / "data" / "store" / "own.txt").write_text("b's own")
    ask = msgspec.json.encode(SeatMoveAsk(seat="memory", to="b"))
    msg = await m.nc.request(node_subject("a", SEAT_MOVE), ask, timeout=10)
    reply = msgspec.json.decode(msg.data, type=SeatMoveReply)
    assert reply.ok and (reply.seat, reply.from_node, reply.to) == ("memory", "a", "b") and reply.object, reply
    await m.bundle_state("b", "store/tools", "ready", timeout=10)
    assert (await seat_of(m, "b")).state == "held"
    data_b = m.tmp / "state-b" / "data"
    assert (data_b / "store" / "kept.txt").read_text() == "kept on a"
    [aside] = data_b.glob("store.before-move-*")  # b's own folder is kept aside, never deleted
    assert (aside / "own.txt").read_text() == "b's own"
    assert len(child_of(script, "b")) == 1  # started once, on the moved data
    await until(lambda: _elsewhere(m, "a", "b"), "a standing by for b")
    _, code = await m.call("mesh.tool.store.remember", {})
    assert code is None and len(child_of(script, "b")[-1].calls()) == 1
    # Nothing left behind: a's folder aside (not live), the packed copy gone from the bus, the store the same.
    data_a = m.tmp / "state-a" / "data"
    assert not (data_a / "store").exists() and [p.name for p in data_a.glob("store.stale-*")]
    assert not child_of(script, "a")[-1].running
    obs = await m.nc.jetstream().object_store("mesh-seat-data")
    assert not await _has_objects(obs)
    moved = json.loads((data_b / "store" / ".mesh-store-memory.json").read_text())["store"]
    home = await (await SeatLeases.open(m.nc, 1.5)).home("memory")
    assert home is not None and home.record.store == moved and home.record.store_node == "a"  # type: ignore[union-attr]


async def _has_objects(obs: Any) -> bool:
    try:
        return bool(await obs.list(ignore_deletes=True))
    except Exception:  # nats-py says "no objects" with an exception
        return False


async def test_a_removed_modules_refused_claim_is_gone_from_status(tmp_path: Path, m: Mesh, script: Script) -> None:
    echo_seat = '[[seat]]\nname = "echo"\nstateless = true\n'
    for module in ("first", "second"):
        script.modules[module] = [Behaviour(answer=echo, tools=("echo.say",))]
    first, second = (module_folder(tmp_path, name, seats=echo_seat) for name in ("first", "second"))
    await m.start("n1", first, second)
    await m.bundle_state("n1", "second/tools", "ready")
    await m.modules("n1").remove_module("second")
    assert (await m.status("n1")).seats == [SeatStatus("echo", "first", "held")]
    await m.modules("n1").add_module(placement(second))  # claims again: refused again, said again
    assert [(s.module, s.state) for s in (await m.status("n1")).seats] == [("first", "held"), ("second", "refused")]
    await m.modules("n1").add_module(placement(second))  # an upgrade in place of the refused one: said once
    assert [(s.module, s.state) for s in (await m.status("n1")).seats] == [("first", "held"), ("second", "refused")]


async def test_a_module_removed_from_the_holder_releases_its_lease_and_a_replicated_seat_moves_on(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script, failover="replicated")
    await m.modules("a").remove_module("store")
    assert (await m.status("a")).seats == []
    await m.bundle_state("b", "store/tools", "ready")
    assert (await seat_of(m, "b")).state == "held"
    lease = await (await SeatLeases.open(m.nc, 1.5)).read("memory")
    assert lease is not None and lease.record.node == "b"


async def test_the_holder_upgraded_in_place_keeps_its_lease_and_serves_the_seat_from_the_new_version(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    before = await (await SeatLeases.open(m.nc, 1.5)).read("memory")
    v2 = module_folder(tmp_path / "a2", "store", seats=MEMORY, version="0.2.0")
    await m.modules("a").add_module(placement(v2))
    assert (await seat_of(m, "a")).state == "held"
    _, code = await m.call("mesh.seat.memory.get", {})
    assert code is None
    old, new = child_of(script, "a")
    assert not old.running and len(new.calls()) == 1
    after = await (await SeatLeases.open(m.nc, 1.5)).read("memory")
    assert before is not None and after is not None and after.record == before.record  # the same lease, renewed
    assert (await seat_of(m, "b")).holder == "a"


async def test_a_killed_holder_started_again_takes_its_own_lease_back_at_once(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    await m.kill("a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await m.start("a", store(tmp_path, "a"), seats=SEATS)
    await m.bundle_state("a", "store/tools", "ready")
    assert (await seat_of(m, "a")).state == "held"
    assert loop.time() - started < 1.5, "it waited for its own lease to expire"
    _, code = await m.call("mesh.tool.store.remember", {})
    assert code is None and len(child_of(script, "a")[-1].calls()) == 1


async def test_a_standby_node_lists_none_of_the_modules_endpoints(tmp_path: Path, m: Mesh, script: Script) -> None:
    await pair(m, tmp_path, script)
    infos = {i["metadata"]["node"]: i for i in await collect_infos(m.nc, 0.3)}
    assert sorted(e["subject"] for e in infos["a"]["endpoints"]) == ["mesh.seat.memory.get", "mesh.tool.store.remember"]
    assert infos["b"]["endpoints"] == [] and infos["b"]["metadata"]["seats"] == ""
    assert infos["a"]["metadata"]["seats"] == "memory"


# --- the store's identity (issue 22) ---------------------------------------------------------------
async def test_a_local_seat_restarted_on_an_empty_state_folder_answers_503_naming_its_store_and_creates_nothing(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await pair(m, tmp_path, script)
    home = await (await SeatLeases.open(m.nc, 1.5)).home("memory")
    assert home is not None and home.record.store and home.record.store_node == "a"  # type: ignore[union-attr]
    expected = home.record.store  # type: ignore[union-attr]
    folder = m.tmp / "state-a" / "data" / "store"
    assert json.loads((folder / ".mesh-store-memory.json").read_text())["store"] == expected
    assert (await seat_of(m, "a")).store == expected
    await m.stop("b")  # only a answers now
    await m.stop("a")
    shutil.rmtree(m.tmp / "state-a")  # a new disk: the same name, an empty state folder
    await m.start("a", store(tmp_path, "a"), seats=SEATS)
    for subject in ("mesh.seat.memory.get", "mesh.tool.store.remember"):
        body = await answer(m, subject, "503")
        e = body["error"]
        assert (e["kind"], e["seat"], e["node"]) == ("seat_unavailable", "memory", "a"), e
        assert e["store"]["id"] == expected and e["store"]["node"] == "a" and e["store"]["since"] > 0, e
        assert e["store"]["path"] == str(folder) and e["store"]["found"] == "no folder", e
        assert expected in e["message"] and str(folder) in e["message"]
        assert any("meshctl seat restore memory --node a" in w for w in e["ways_out"]), e["ways_out"]
        assert any("meshctl seat adopt memory --node a" in w for w in e["ways_out"]), e["ways_out"]

    async def refused() -> SeatStatus | None:
        seat = await seat_of(m, "a")
        return seat if seat.state == "refused" else None

    seat = await until(refused, "a's status saying the seat is refused", timeout=8, every=0.02)
    assert seat.store == expected and expected in seat.reason
    assert not folder.exists() and child_of(script, "a")[-1].spec.env["MESH_NODE"] == "a"  # type: ignore[union-attr]
    assert len(child_of(script, "a")) == 1  # the first run's child only: no child, no store on the new disk
    assert (await m.status("a")).bundle("store/tools").state == "standby"  # type: ignore[union-attr]
    # The operator's word: a new, empty store on purpose, with a new id.
    await adopt(m.nc, "memory", "a")
    await answer(m, "mesh.seat.memory.get", None)
    new = json.loads((folder / ".mesh-store-memory.json").read_text())["store"]
    assert new != expected
    # The status names the new store a moment after the seat's subject answers (as for held, above).
    await until(lambda: _store_is(m, "a", new), "a's status naming the adopted store", timeout=8, every=0.02)


async def _store_is(m: Mesh, node: str, store_id: str) -> bool:
    return (await seat_of(m, node)).store == store_id


async def test_a_folder_holding_another_store_is_not_served(tmp_path: Path, m: Mesh, script: Script) -> None:
    await pair(m, tmp_path, script)
    await m.stop("b")
    await m.stop("a")
    folder = m.tmp / "state-a" / "data" / "store"
    identity = json.loads((folder / ".mesh-store-memory.json").read_text())
    (folder / ".mesh-store-memory.json").write_text(json.dumps({**identity, "store": "0123456789abcdef"}))
    await m.start("a", store(tmp_path, "a"), seats=SEATS)
    body = await answer(m, "mesh.seat.memory.get", "503")
    assert "store 0123456789abcdef (made on node a), another store" == body["error"]["store"]["found"]
    assert sorted(p.name for p in folder.iterdir()) == [".mesh-store-memory.json"]  # nothing added
