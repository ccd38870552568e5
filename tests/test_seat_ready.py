"""`ready` means the bundle's subjects answer: a tools bundle whose module holds a stateful seat
is shown `ready` only once the seat's lease was looked at and its subjects subscribed here, and
`standby` (never `ready`) while another node holds the seat.

The defect this guards: the children start before the bus answers and the node answers status
before it claims its seats, so a caller that waited for `ready` and called the seat verb at once
got "no responders" (the seat was not looked at yet, and status listed no seat at all)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import anyio
import nats
import pytest
from nats.aio.client import Client

from manifests import load_module
from runtime.bus.embedded import free_port
from runtime.calls.routes import ModuleEntry, RouteTable
from runtime.config import NodeConfig
from runtime.hosting.placement import from_source
from runtime.seats.seats import LOOKING, SERVING, STANDBY, Seats, shown_state, stateful_seats, wanted_seats
from runtime.wire.leases import Held, LeaseRecord, SeatLeases
from tests.support.mesh import FAST_CONFIG, NatsServer, NodeProcess, client, make_module, status


# --- the rule, alone ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("child", "standing", "shown"),
    [
        ("ready", SERVING, "ready"),
        ("ready", LOOKING, "starting"),  # the child is up, the seat's lease not looked at yet
        ("ready", STANDBY, "standby"),  # the child is up, the seat is held by another node
        ("starting", SERVING, "starting"),
        ("failed", STANDBY, "failed"),  # a child that is down says so, whatever its seats
        ("backoff", LOOKING, "backoff"),
    ],
)
def test_a_bundle_is_shown_ready_only_when_its_seats_let_it_serve(child: str, standing: str, shown: str) -> None:
    assert shown_state(child, standing) == shown


# --- the seats of one module, in this process against a real nats-server ------------------------
@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[Client]:
    server = NatsServer(tmp_path / "nats").start()
    nc = await nats.connect(server.url)
    try:
        yield nc
    finally:
        await nc.close()
        server.stop()


class Claimed:
    """Seats of module `store` (stateful seat `echo`, stateless seat `clock`) on node `n1`; every
    subscription the seats ask of the node is recorded with what status said at that instant."""

    def __init__(self, tmp_path: Path, nc: Client) -> None:
        folder = make_module(tmp_path / "mods", "store", seats=["echo"])
        with open(folder / "module.toml", "a") as f:
            f.write('\n[[seat]]\nname = "clock"\nstateless = true\n')
        self.placement = from_source(load_module(folder))
        self.table = RouteTable("n1")
        self.entry = ModuleEntry(
            "store",
            "0.1.0",
            [],
            declared_seats=["echo", "clock"],
            stateful=stateful_seats(self.placement),
            wanted_seats=wanted_seats(self.placement),
        )
        self.table.modules["store"] = self.entry
        self.subscribed: list[tuple[str, str]] = []  # (subject, standing when it was subscribed)
        self.changes: list[str] = []  # what the node would say on mesh.events.tools
        config = NodeConfig(name="n1", state_dir=str(tmp_path / "state"))
        self.seats = Seats("n1", config, self.table, "run1", host=self)
        self.nc = nc

    # The seats' host (runtime/seats/seats.py SeatsHost), as the node's module host would be.
    async def serve(self, subject: str) -> None:
        if subject not in [s for s, _ in self.subscribed]:  # as the node's: once per subject
            self.subscribed.append((subject, self.seats.standing(self.entry)))

    async def unserve(self, subject: str) -> None:
        pass

    def rebuild(self) -> None:
        self.table.rebuild()

    def served_changed(self, reason: str) -> None:
        self.changes.append(reason)

    async def start_module(self, module: str) -> None:
        pass

    async def stop_module(self, module: str) -> None:
        pass

    def started(self, bundle: object) -> bool:
        return False

    async def claim(self, then: Callable[[], Awaitable[None]]) -> None:
        async with anyio.create_task_group() as tg:
            self.seats.serve(self.nc, "SVC1", tg)
            await self.seats.claim(self.placement, self.entry, None)
            await then()
            await self.seats.close()
            tg.cancel_scope.cancel()


async def test_a_held_seat_is_said_only_after_its_subjects_are_subscribed(tmp_path: Path, bus: Client) -> None:
    claimed = Claimed(tmp_path, bus)
    # Added, not claimed yet (the node's start: every child first, the seats after): not serving.
    assert claimed.seats.standing(claimed.entry) == LOOKING

    async def then() -> None:
        assert claimed.seats.standing(claimed.entry) == SERVING
        assert sorted(s.state for s in claimed.seats.status.values()) == ["held", "held"]

    await claimed.claim(then)
    subjects = [subject for subject, _ in claimed.subscribed]
    assert sorted(subjects) == ["mesh.seat.clock.>", "mesh.seat.echo.>", "mesh.tool.store.>"], subjects
    # At every subscription status did not say `serving` yet: it says so only once all are made.
    assert [standing for _, standing in claimed.subscribed] == [LOOKING] * 3, claimed.subscribed
    # A seat taken changes what the node serves: the MCP face is told to look again.
    assert claimed.changes == ["seat echo held"], claimed.changes


async def test_a_seat_held_by_another_node_leaves_the_bundle_on_standby_naming_the_holder(
    tmp_path: Path, bus: Client
) -> None:
    leases = await SeatLeases.open(bus, 5)
    other = LeaseRecord(node="n2", module="store", service="NOSUCHSERVICE", run="r2", since=time.time())
    assert isinstance(await leases.acquire("echo", other), Held)
    claimed = Claimed(tmp_path, bus)

    async def then() -> None:
        assert claimed.seats.standing(claimed.entry) == STANDBY
        echo = claimed.seats.status["echo"]
        assert echo.state == "elsewhere" and echo.holder == "n2", echo

    await claimed.claim(then)
    # Neither the seat's verbs nor the module's own tools (they share its store) are served here.
    subjects = [subject for subject, _ in claimed.subscribed]
    assert subjects == ["mesh.seat.clock.>"], subjects
    assert claimed.changes == ["seat echo elsewhere"], claimed.changes


# --- a real node whose bus comes up after its children --------------------------------------------
async def test_a_bundle_shown_ready_answers_its_seat_verb_at_once(tmp_path: Path) -> None:
    """A stateful module's child waits for its seat (no store where the seat is not held): it is not
    started while the bus is away; once the bus is up the first status must not say `ready` while
    the seat is not served yet. Every status seen is checked, tightly polled."""
    port = free_port()
    mods = tmp_path / "mods"
    make_module(mods, "store", seats=["echo"])
    node = NodeProcess(tmp_path, mods, f"nats://127.0.0.1:{port}", "late", config=FAST_CONFIG)
    server: NatsServer | None = None
    try:
        node.wait_log("is out of reach")
        time.sleep(1.0)
        assert "bundle store/tools ready" not in node.log()  # no seat, no child, no store
        server = NatsServer(tmp_path / "nats", port=port).start()
        nc = await client(server.url)
        seen: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                shown = await status(nc, "late")
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                await anyio.sleep(0.002)
                continue
            bundles = [b["state"] for b in shown["bundles"] if b["module"] == "store"]
            seen += bundles
            if bundles == ["ready"]:
                for subject in ("mesh.seat.echo.say", "mesh.tool.store.whoami"):
                    try:
                        msg = await nc.request(subject, b"{}", timeout=5)
                    except nats.errors.NoRespondersError:
                        raise AssertionError(f"{subject}: no responders after status said ready; seen {seen}") from None
                    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), (subject, msg.headers, msg.data)
                assert [s["state"] for s in shown["seats"]] == ["held"], shown["seats"]
                break
            assert set(bundles) <= {"starting"}, seen  # before ready, only `starting` (or not listed yet)
            await anyio.sleep(0.002)
        assert seen and seen[-1] == "ready", seen
        await nc.close()
    finally:
        node.kill()
        if server is not None:
            server.stop()
