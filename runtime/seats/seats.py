"""The seats of the modules on one node: held here, refused, or held elsewhere.

A stateless seat (and a second claimant on this node) is decided here at once; a stateful one
is held through its lease by a `SeatKeeper` (runtime/seats/keeper.py), whose every change of mind
comes back to `changed`: the seat's subjects, and its module's own tools (they share its
store), are subscribed only while the module holds all its stateful seats here.

A seat says `held` only once its subjects are subscribed, and a module's tools bundles are shown
`ready` only once every seat it wants here is decided (`standing`, `shown_state`): a caller that
waits for `ready` and then calls a seat verb is answered, never told "no responders".
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import anyio.abc
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from manifests import Seat
from runtime.calls.routes import ModuleEntry, RouteTable
from runtime.config import NatsConfig, NodeConfig
from runtime.hosting.placement import Placement, data_dir
from runtime.seats.data import SeatData
from runtime.seats.keeper import SeatKeeper
from runtime.seats.move import export_seat, import_seat, needs_import
from runtime.seats.store import move_aside
from runtime.wire.control import SeatMoveAsk, SeatMoveReply, SeatStatus
from runtime.wire.errors import NodeError
from runtime.wire.leases import HomeRecord, SeatLeases
from runtime.wire.subjects import SEAT_PREFIX, TOOL_PREFIX

log = logging.getLogger("mesh.node")


class SeatsHost(Protocol):
    """What the seats ask of the node's module host (runtime/node/modules.py)."""

    async def serve(self, subject: str) -> None:
        """Take requests on `subject` (the Service API's subscription, runtime/bus/service_api.py)."""

    async def unserve(self, subject: str) -> None:
        """Stop taking requests on `subject`."""

    def rebuild(self) -> None:
        """The routes again, from who holds what now."""

    def served_changed(self, reason: str) -> None:
        """What this node serves changed (its mesh.events.tools notice)."""

    async def start_module(self, module: str) -> None:
        """A stateful module's steps and tools children, started on its store (the seat is about to be held)."""

    async def stop_module(self, module: str) -> None:
        """Its tools children stopped: the seat is not held here (any more)."""

    def started(self, bundle: object) -> bool:
        """Whether this tools runner runs (a stateful module's wait until its seats are held)."""


def wanted_seats(placement: Placement) -> list[str]:
    """The seats this placement claims on this node: all its module declares, or those it names."""
    module = placement.loaded.module
    return module.seat_names() if placement.seats is None else list(placement.seats)


def stateful_seats(placement: Placement) -> set[str]:
    """The seats this placement holds through a lease: every wanted seat not declared stateless."""
    wanted = wanted_seats(placement)
    return {s.name for s in placement.loaded.module.seat if s.name in wanted and not s.stateless}


# What a module's seats leave its tools bundles on this node (`Seats.standing`):
SERVING = "serving"  # every seat it wants is decided, its stateful ones are held here: all is served
LOOKING = "looking"  # a seat is not decided yet (its lease not looked at): its subjects may not answer
STANDBY = "standby"  # a stateful seat is held by another node, or refused: none of its tools is served here


def shown_state(child: str, standing: str) -> str:
    """A tools bundle's state in status: its child's, except that `ready` waits for its seats.

    A child that is ready while a seat's lease is still being looked at is `starting` (its seat
    verbs would get "no responders"); one whose module's stateful seat is held by another node,
    or refused, is `standby` (the node's seat status names the holder, or why not)."""
    if child != "ready" or standing == SERVING:
        return child
    return "starting" if standing == LOOKING else "standby"


class Seats:
    """Every seat claim on this node, and the keepers of its stateful seats."""

    def __init__(
        self,
        node: str,
        config: NodeConfig,
        table: RouteTable,
        run_id: str,
        host: SeatsHost,
    ) -> None:
        self.node, self.config, self.table, self.run_id = node, config, table, run_id
        self.state_dir = Path(config.state_dir)
        self.host = host
        self.status: dict[str, SeatStatus] = {}
        self.keepers: dict[str, SeatKeeper] = {}  # stateful seat -> its lease keeper on this node
        self.leases: SeatLeases | None = None
        self.nc: Client | None = None
        self.service_id = ""
        self.bus: NatsConfig | None = None  # how a replicated seat's Litestream reaches the bus
        self._tg: anyio.abc.TaskGroup | None = None
        table.fence = self.fence

    def fence(self, subject: str, module: str) -> NodeError | None:
        """A call to a module whose held lease lapsed (this node was paused past it): 503, not served."""
        for keeper in self.keepers.values():
            if keeper.module == module and keeper.lapsed():
                keeper.wake()  # the keeper learns now whether the lease is still its own
                return keeper.unavailable(subject)
        return None

    def serve(self, nc: Client, service_id: str, tg: anyio.abc.TaskGroup, bus: NatsConfig | None = None) -> None:
        """The bus, this node's Service API id (named in its leases) and where keepers run."""
        self.nc, self.service_id, self._tg, self.bus = nc, service_id, tg, bus

    def shown(self) -> list[SeatStatus]:
        """Every seat's status for `node status`, a held replicated seat with its replica's sync and lag."""
        out = []
        for status in self.status.values():
            keeper = self.keepers.get(status.seat)
            if status.state == "held" and keeper is not None and keeper.module == status.module:
                synced, lag = keeper.sync_facts()
                status = msgspec.structs.replace(status, synced=synced, lag_s=lag)
            out.append(status)
        return out

    def held(self) -> list[str]:
        return sorted(s.seat for s in self.status.values() if s.state == "held")

    def standing(self, entry: ModuleEntry) -> str:
        """SERVING, LOOKING or STANDBY: what the module's seats leave its tools bundles here."""
        states = {seat: self._state_of(seat, entry.name) for seat in entry.wanted_seats}
        if any(state in ("", "starting") for state in states.values()):
            return LOOKING
        if any(states.get(seat) != "held" for seat in entry.stateful):
            return STANDBY
        return SERVING

    def _state_of(self, seat: str, module: str) -> str:
        """The seat's state as this module claimed it; "" while its claim has not begun."""
        for status in self.status.values():
            if status.seat == seat and status.module == module:
                return status.state
        return ""

    async def claim(self, placement: Placement, entry: ModuleEntry, old: ModuleEntry | None) -> None:
        module = placement.loaded.module
        wanted = wanted_seats(placement)
        for seat in wanted:
            declared = next((s for s in module.seat if s.name == seat), None)
            await self._claim(entry, seat, declared)
        for seat in old.seats if old is not None else []:
            if seat not in entry.seats:
                await self.host.unserve(f"{SEAT_PREFIX}{seat}.>")
        await self.close_keepers(module.name, keep=set(wanted))
        await self.own_tools(entry)

    def release(self, entry: ModuleEntry) -> None:
        """Forget what this module holds or was refused here (it goes, or its new version claims again);
        what its keepers say stays until they close (`close_keepers`)."""
        for seat in entry.seats:
            self.table.seat_holders.pop(seat, None)
            self.status.pop(seat, None)
        for key, status in list(self.status.items()):
            keeper = self.keepers.get(status.seat)
            if status.module == entry.name and (keeper is None or keeper.module != entry.name):
                del self.status[key]  # a refused claim (a second claimant): said again if it claims again

    async def _claim(self, entry: ModuleEntry, seat: str, declared: Seat | None) -> None:
        holder = self.table.seat_holders.get(seat)
        keeper = self.keepers.get(seat)
        other = (
            holder
            if holder not in (None, entry.name)
            else (keeper.module if keeper and keeper.module != entry.name else None)
        )
        if other is not None:
            reason = f"module {other} already holds seat {seat} on node {self.node}; one holder per seat per node"
            entry.stateful.discard(seat)
            self._refuse(seat, entry.name, reason)
            return
        if declared is None or declared.stateless:
            self.table.seat_holders[seat] = entry.name
            entry.seats.append(seat)
            await self.host.serve(f"{SEAT_PREFIX}{seat}.>")
            self.status[seat] = SeatStatus(seat, entry.name, "held")  # said once its subjects answer
            return
        if keeper is not None:  # the same module again (an upgrade): the lease stays, the entry is new
            await self.changed(keeper)
            return
        await self._start_keeper(entry, seat, declared)

    async def _start_keeper(self, entry: ModuleEntry, seat: str, declared: Seat) -> None:
        """A stateful seat is held through its lease, looked at once now and then kept."""
        assert self.nc is not None and self._tg is not None, "seats are claimed while the node serves"
        try:
            if self.leases is None:
                self.leases = await SeatLeases.open(
                    self.nc, self.config.seats.lease_ttl_s, self.config.seats.replicas or 3
                )
        except Exception as e:  # no JetStream on this bus: no lease, so no stateful seat
            # Its module's own tools stay unserved too (entry.stateful keeps the seat): they share its store.
            self._refuse(
                seat,
                entry.name,
                f"the seat lease bucket cannot be opened ({type(e).__name__}: {e}); "
                "a stateful seat needs JetStream on the bus",
            )
            return
        failover = declared.failover
        name = entry.name
        data = SeatData(
            nc=self.nc,
            leases=self.leases,
            seat=seat,
            module=name,
            node=self.node,
            failover=failover,
            databases=list(declared.databases),
            data_dir=data_dir(self.state_dir, name),
            state_dir=self.state_dir,
            seats_config=self.config.seats,
            bus=self.bus,
            owner=(self.config.child_user, self.config.child_group),
            start_module=lambda: self.host.start_module(name),
            stop_module=lambda: self.host.stop_module(name),
            tg=self._tg,
        )
        keeper = SeatKeeper(
            self.nc,
            self.leases,
            seat=seat,
            module=entry.name,
            node=self.node,
            service_id=self.service_id,
            run_id=self.run_id,
            failover=failover,
            data=data,
            queue_group=self.config.queue_group,
            subjects=[f"{SEAT_PREFIX}{seat}.>", f"{TOOL_PREFIX}{entry.name}.>"],
            on_change=self.changed,
            prepare_home=lambda home: self._take_in_data(seat, home),
        )
        self.keepers[seat] = keeper
        self.status[seat] = SeatStatus(seat, entry.name, "starting")
        try:
            await keeper.look()
        except Exception as e:  # the loop looks again
            log.warning("seat %s: first look at its lease failed (%s); trying again", seat, e)
        self._tg.start_soon(keeper.run)

    async def _take_in_data(self, seat: str, home: HomeRecord) -> None:
        """Data moved to this node by `meshctl seat move` comes in before the seat is held."""
        keeper = self.keepers.get(seat)
        entry = self.table.modules.get(keeper.module) if keeper else None
        if entry is None or self.nc is None or not needs_import(self.state_dir, seat, home):
            return
        await import_seat(
            self.nc,
            seat=seat,
            home=home,
            state_dir=self.state_dir,
            data_dir=data_dir(self.state_dir, entry.name),
            bundles=[b for b in entry.bundles if self.host.started(b)],
            owner=(self.config.child_user, self.config.child_group),
            ready_timeout_s=self.config.health.init_timeout_s * 3,
        )

    async def on_move(self, msg: Msg) -> None:
        """`meshctl seat move`: step down, pack the seat's data, name the new home; the answer says how it went."""
        try:
            ask = msgspec.json.decode(msg.data or b"{}", type=SeatMoveAsk)
        except (msgspec.DecodeError, msgspec.ValidationError):
            ask = SeatMoveAsk()
        seat, to = ask.seat, ask.to
        keeper = self.keepers.get(seat)
        entry = self.table.modules.get(keeper.module) if keeper else None
        if keeper is None or entry is None or not to or not self.leases or self.nc is None:
            reply = SeatMoveReply(
                ok=False,
                error=f"node {self.node} has no stateful seat {seat!r} to move "
                f"(seats with a lease here: {', '.join(self.keepers) or 'none'}); name a target with --to",
            )
        else:
            keeper.hold_off = True
            try:
                await keeper.step_down(f"its data is being moved to node {to}")
                record = await export_seat(
                    self.nc,
                    self.leases,
                    seat=seat,
                    module=entry.name,
                    node=self.node,
                    to=to,
                    data_dir=data_dir(self.state_dir, entry.name),
                    bundles=list(entry.bundles),
                    drain_timeout_s=self.config.drain_timeout_s,
                )
                reply = SeatMoveReply(ok=True, seat=seat, from_node=self.node, to=to, object=record.data)
                # The old home's copy is not left live: its children stop, its folder goes aside.
                await self.host.stop_module(entry.name)
                aside = move_aside(data_dir(self.state_dir, entry.name))
                log.warning("seat %s: moved to node %s; this node's folder kept aside in %s", seat, to, aside)
            except Exception as e:  # the home did not change: this node takes the seat back
                log.error("seat %s: move to node %s failed: %s", seat, to, e)
                reply = SeatMoveReply(
                    ok=False, error=f"moving seat {seat} to node {to} failed: {e}; it stays on node {self.node}"
                )
            finally:
                keeper.hold_off = False
        if msg.reply:
            await msg.respond(msgspec.json.encode(reply))

    async def changed(self, keeper: SeatKeeper) -> None:
        """A keeper's word: serve the seat (and its module's own tools) here, or stop at once."""
        entry = self.table.modules.get(keeper.module)
        if entry is None:
            return
        seat = keeper.seat
        if keeper.state == "held":
            self.table.seat_holders[seat] = entry.name
            if seat not in entry.seats:
                entry.seats.append(seat)
            self.host.rebuild()
            await self.host.serve(f"{SEAT_PREFIX}{seat}.>")
            await self.own_tools(entry)
            # Held is said once the seat's subjects and the module's tools are subscribed: status
            # shows the module's bundles `ready` from then on.
            self.status[seat] = SeatStatus(seat, entry.name, "held", store=keeper.store)
            self.host.served_changed(f"seat {seat} held")
            return
        if seat in entry.seats:
            entry.seats.remove(seat)
            self.table.seat_holders.pop(seat, None)
        expected = keeper.missing.home.store if keeper.missing is not None else ""
        self.status[seat] = SeatStatus(
            seat, entry.name, keeper.state, keeper.reason, keeper.holder, keeper.home, store=expected
        )
        self.host.rebuild()  # routes first: a call still queued on the subscription is refused
        await self._unsubscribe_quietly(f"{SEAT_PREFIX}{seat}.>")
        await self.own_tools(entry)
        self.host.served_changed(f"seat {seat} {keeper.state}")

    async def own_tools(self, entry: ModuleEntry) -> None:
        """A module's own tools share the store of its stateful seats: served only where it holds them all."""
        subject = f"{TOOL_PREFIX}{entry.name}.>"
        if entry.serves_own_tools():
            await self.host.serve(subject)
        else:
            self.host.rebuild()
            await self._unsubscribe_quietly(subject)
        self.host.rebuild()

    async def _unsubscribe_quietly(self, subject: str) -> None:
        try:
            await self.host.unserve(subject)
        except Exception as e:  # a broken bus: the subscription is gone with the connection
            log.warning("could not unsubscribe %s: %s", subject, e)

    async def close_keepers(self, module: str, keep: set[str]) -> None:
        for seat, keeper in list(self.keepers.items()):
            if keeper.module == module and seat not in keep:
                del self.keepers[seat]
                await keeper.close()
                self.status.pop(seat, None)

    def _refuse(self, seat: str, module: str, reason: str) -> None:
        log.error("seat %s: claim of module %s refused: %s", seat, module, reason)
        key = seat if seat not in self.status else f"{seat}#{module}"
        self.status[key] = SeatStatus(seat, module, "refused", reason)

    async def close(self) -> None:
        """A clean stop: every lease released, so a successor need not wait for it to expire."""
        for keeper in list(self.keepers.values()):
            await keeper.close()
