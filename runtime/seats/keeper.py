"""One stateful seat on one node: hold it through its lease, or stand by naming who holds it.

A keeper looks once at start (so the node's first status already says who holds the seat) and
then every `interval` seconds: a holder renews its lease, fenced by revision, and stops serving
at once when the renewal says another write came between, or when it could not renew for two
thirds of the lease's life (another node may take the seat once it expires). A node that does
not hold the seat leaves its subjects to the holder while the holder answers its Service API
ping; when it does not (dead, lease not yet expired) or when the seat's data lives on another
node's disk, the keeper answers the seat's subjects itself with 503 naming the seat, the holder
and the ways out. It never takes a disk-backed seat whose home is another node.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Awaitable, Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from runtime.bus.service_api import SERVICE_NAME
from runtime.seats.data import SeatData
from runtime.seats.store import StoreMissing
from runtime.wire.errors import SeatUnavailable, render
from runtime.wire.leases import Found, Held, HomeRecord, LeaseLost, LeaseRecord, SeatLeases, seat_key

log = logging.getLogger("mesh.seats")

_SERVICE_ID = re.compile(r"^[A-Za-z0-9]{1,64}\Z")
PING_TIMEOUT_S = 0.5


class SeatKeeper:
    """Holds `seat` for `module` on `node`, or says who does. States: starting, held, elsewhere, refused."""

    def __init__(
        self,
        nc: Client,
        leases: SeatLeases,
        *,
        seat: str,
        module: str,
        node: str,
        service_id: str,
        run_id: str,
        failover: str,
        subjects: list[str],
        queue_group: str,
        on_change: Callable[[SeatKeeper], Awaitable[None]],
        prepare_home: Callable[[HomeRecord], Awaitable[None]] | None = None,
        data: SeatData | None = None,
    ) -> None:
        self.nc, self.leases = nc, leases
        self.seat, self.module, self.node = seat, module, node
        self.service_id, self.run_id, self.failover = service_id, run_id, failover
        self.subjects, self.queue_group = subjects, queue_group
        self.on_change = on_change
        self.prepare_home = prepare_home  # the node takes in data moved to it before it holds the seat
        self.hold_off = False  # set while the seat's data is being moved away: no taking it back
        self.data = data  # the seat's store on this node (None: its data is not in the module's folder)
        self.missing: StoreMissing | None = None  # the folder holds another store (or none): 503 here
        self.store = ""  # the store id served, while held
        self.state = "starting"
        self.holder = ""  # the node holding the lease, when another one does
        self.home = ""  # the node whose disk holds the data, when it is not this one
        self.reason = ""
        self.silent = False  # the holder does not answer its ping
        self.renewals_failed = 0  # renewals of a held lease that did not go through (metrics)
        ttl = leases.ttl_s
        self.interval = min(ttl / 3, 1.0)
        self._held: Held | None = None
        self._renewed_at = 0.0  # monotonic time just before the last successful write
        self._standby: list[Subscription] = []
        self._said: tuple[str, ...] = ()
        self._closed = False
        self._woken = anyio.Event()

    @property
    def disk_backed(self) -> bool:
        return self.failover == "local"

    # --- the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch)
            while not self._closed:
                with anyio.move_on_after(self.interval):
                    await self._woken.wait()
                self._woken = anyio.Event()
                if self._closed:
                    break
                try:
                    await self.look()
                except Exception as e:  # the bus is away: the next round tries again
                    if self._held is not None:
                        self.renewals_failed += 1
                    log.warning("seat %s: cannot reach the lease (%s: %s)", self.seat, type(e).__name__, e)
                    try:
                        await self._check_validity()
                    except Exception as e2:  # a broken bus breaks the standby answers too; the loss stands
                        log.warning("seat %s: %s", self.seat, e2)
            tg.cancel_scope.cancel()

    async def _watch(self) -> None:
        """Another node's write to the lease wakes the keeper at once, not at its next round:
        a standby stops answering 503 the moment a holder is back, a holder learns of an intruder."""
        while not self._closed:
            watcher = None
            try:
                watcher = await self.leases.leases.watch(seat_key(self.seat))
                async for entry in watcher:
                    if entry is not None and not self._is_own_write(entry.value, entry.operation):
                        self._woken.set()
            except Exception as e:  # the bus is away: the loop's rounds go on meanwhile
                log.debug("seat %s: lease watch ended (%s); watching again", self.seat, e)
            finally:
                if watcher is not None:
                    with anyio.CancelScope(shield=True):
                        try:
                            await watcher.stop()
                        except Exception:  # its subscription went with the connection
                            pass
            await anyio.sleep(self.interval)

    def _is_own_write(self, value: bytes | None, operation: str | None) -> bool:
        if operation not in (None, "PUT") or not value:
            return False
        try:
            record = msgspec.json.decode(value, type=LeaseRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        return record.node == self.node and record.run == self.run_id

    async def look(self) -> None:
        """One round: renew what is held; take the seat when it is free and ours to take."""
        if self._held is not None:
            await self._renew()
            return
        if self.hold_off:
            return
        found = await self.leases.read(self.seat)
        if found is not None:
            record = found.record
            assert isinstance(record, LeaseRecord)
            if record.node != self.node:
                await self._elsewhere(record)
                return
        if self.disk_backed:
            home = await self.leases.home(self.seat)
            if home is not None and isinstance(home.record, HomeRecord) and home.record.node != self.node:
                # A first holder writes its lease before the home: read the lease again, or a node
                # that started with it would call the seat unheld while it is being held.
                found = await self.leases.read(self.seat)
                if found is not None and isinstance(found.record, LeaseRecord) and found.record.node != self.node:
                    await self._elsewhere(found.record)
                else:
                    await self._refused(home.record)
                return
            if home is not None and isinstance(home.record, HomeRecord) and self.prepare_home is not None:
                try:
                    await self.prepare_home(home.record)
                except Exception as e:  # the seat is not taken with half its data
                    await self._set(
                        "refused",
                        holder="",
                        home=self.node,
                        silent=True,
                        reason=f"taking in the data moved to this node failed: {e}",
                    )
                    return
        if self.data is not None:
            if not await self._prepare_data():
                return
        started = time.monotonic()
        got = await self.leases.acquire(self.seat, self._record())
        if isinstance(got, Found):  # another node was first by a hair
            assert isinstance(got.record, LeaseRecord)
            if self.data is not None:
                await self.data.after_loss()
            await self._elsewhere(got.record)
            return
        if self.disk_backed and self.data is None:
            home_record = await self.leases.settle_home(self.seat, HomeRecord(self.node, self.module, time.time()))
            if home_record.node != self.node:
                await self.leases.release(got)
                await self._refused(home_record)
                return
        self._held, self._renewed_at = got, started
        await self._set("held", holder="", home="", reason="", silent=False)
        if self.data is not None:
            await self.data.held()

    async def _prepare_data(self) -> bool:
        """The store checked, restored or made, its children started: True when the lease may be taken."""
        assert self.data is not None
        try:
            home = await self.data.prepare(await self.leases.home(self.seat))
        except StoreMissing as e:
            self.missing = e
            await self._set("refused", holder="", home="", reason=str(e), silent=True)
            return False
        except Exception as e:  # a restore or a start that failed: nothing is served, the next round tries again
            await self.data.after_loss()
            await self._set(
                "refused", holder="", home="", reason=f"the store of seat {self.seat} is not ready: {e}", silent=True
            )
            return False
        if home is None:
            return False  # another node moved first: the next round sees what it did
        self.missing, self.store = None, home.store
        return True

    async def _renew(self) -> None:
        assert self._held is not None
        started = time.monotonic()
        if self.data is not None and self.data.replicated:
            try:
                synced, lag = await self.data.sync_facts()
                record = msgspec.structs.replace(self._held.record, synced=synced, lag_s=round(lag, 3))
                self._held = Held(self._held.seat, self._held.revision, record)
            except Exception as e:  # the facts are for people; the lease is renewed anyway
                log.debug("seat %s: replica facts unknown (%s)", self.seat, e)
        try:
            self._held = await self.leases.renew(self._held)
            self._renewed_at = started
        except LeaseLost as e:
            self.renewals_failed += 1
            await self._lose(str(e))
            await self.look()  # learn at once who holds it now

    def sync_facts(self) -> tuple[float, float]:
        """A replicated seat held here: its replica's last sync and lag at the last renewal; else zeros."""
        record = self._held.record if self._held is not None else None
        return (record.synced, record.lag_s) if record is not None else (0.0, 0.0)

    def wake(self) -> None:
        self._woken.set()

    def lapsed(self) -> bool:
        """Held, but not renewed for two thirds of the lease's life (a pause, a stalled loop): by now
        another node may hold the seat, so no call is served until the keeper knows."""
        return self._held is not None and time.monotonic() - self._renewed_at > self.leases.ttl_s * 2 / 3

    async def _check_validity(self) -> None:
        # Unable to renew for two thirds of its life: by the time it expires another node may hold it.
        if self._held is not None and time.monotonic() - self._renewed_at > self.leases.ttl_s * 2 / 3:
            await self._lose(
                f"could not renew the lease of seat {self.seat} for "
                f"{time.monotonic() - self._renewed_at:.1f} s of its {self.leases.ttl_s:g} s"
            )

    async def step_down(self, why: str) -> None:
        """Stop serving and release the lease now (a move): with hold_off set, it is not taken back."""
        held, self._held = self._held, None
        if held is not None:
            await self.leases.release(held)
        await self._set("refused", holder="", home="", reason=why, silent=True)

    async def _lose(self, why: str) -> None:
        # Litestream first, before anything else: nothing more of this holder reaches the replica.
        if self.data is not None:
            self.data.kill_now()
        self._held = None
        log.error("seat %s: %s; node %s stopped serving it at once", self.seat, why, self.node)
        self._said = ("lost",)
        await self._set("refused", holder="", home="", reason=why, silent=True)
        if self.data is not None:
            await self.data.after_loss()

    async def _elsewhere(self, record: LeaseRecord) -> None:
        silent = not await self._answers(record)
        reason = f"node {record.node} holds seat {self.seat} (module {record.module})"
        if silent:
            reason += " but does not answer; its lease expires unless it comes back"
        await self._set("elsewhere", holder=record.node, home="", reason=reason, silent=silent)

    async def _refused(self, home: HomeRecord) -> None:
        reason = (
            f"seat {self.seat} keeps its data on node {home.node}'s disk ({home.how}) and nobody holds it; "
            f"node {self.node} would start with an empty store"
        )
        await self._set("refused", holder="", home=home.node, reason=reason, silent=True)

    async def _answers(self, record: LeaseRecord) -> bool:
        if not _SERVICE_ID.match(record.service):
            return False  # not a node's record: nobody to ask, and nobody serving
        try:
            await self.nc.request(f"$SRV.PING.{SERVICE_NAME}.{record.service}", b"", timeout=PING_TIMEOUT_S)
            return True
        except NoRespondersError:
            return False
        except NatsTimeout:
            return True  # slow is not dead: answering 503 beside a live holder would be worse

    def _record(self) -> LeaseRecord:
        return LeaseRecord(
            node=self.node, module=self.module, service=self.service_id, run=self.run_id, since=time.time()
        )

    # --- state, said once ------------------------------------------------------------------
    async def _set(self, state: str, *, holder: str, home: str, reason: str, silent: bool) -> None:
        changed = (state, holder, home, silent) != (self.state, self.holder, self.home, self.silent)
        self.state, self.holder, self.home, self.reason, self.silent = state, holder, home, reason, silent
        if not changed:
            return
        said = (state, holder, home, str(silent))
        if state == "held":
            log.info(
                "seat %s: held by module %s on node %s (lease, %g s)",
                self.seat,
                self.module,
                self.node,
                self.leases.ttl_s,
            )
        elif said != self._said:
            log.error("seat %s: not served by module %s on node %s: %s", self.seat, self.module, self.node, reason)
        self._said = said
        await self._standby_answers(silent and state != "held")
        await self.on_change(self)

    async def _standby_answers(self, on: bool) -> None:
        """While nobody serves the seat, its subjects are answered here: 503, never an empty store."""
        if on and not self._standby:
            for subject in self.subjects:
                self._standby.append(await self.nc.subscribe(subject, queue=self.queue_group, cb=self._answer_503))
        elif not on and self._standby:
            subs, self._standby = self._standby, []
            for sub in subs:
                await sub.unsubscribe()

    def unavailable(self, subject: str) -> SeatUnavailable:
        if self.missing is not None:
            return self._store_missing(subject, self.missing)
        if self.home:
            why = f"its data lives on node {self.home}'s disk and no node holds it"
            holder = self.home
        elif self.holder:
            why = (
                f"its holder, node {self.holder}, does not answer (its lease lasts up to {self.leases.ttl_s:g} s more)"
            )
            holder = self.holder
        else:
            why, holder = self.reason or "this node lost its lease", ""
        ways = []
        if holder:
            ways.append(f"start node {holder} again: it takes the seat back with its data")
            ways.append(
                f"move the data with the seat: `meshctl seat move {self.seat} --to {self.node}` (node {holder} must run)"
            )
        ways.append(
            f"if node {holder or '?'}'s data is gone for good: `meshctl seat adopt {self.seat} --node {self.node}` "
            "starts this node's store, on purpose"
        )
        if not self.disk_backed:
            ways = [f"wait: the lease expires within {self.leases.ttl_s:g} s and a live node takes the seat"] + ways[:1]
        return SeatUnavailable(subject, self.seat, self.module, self.node, holder, why, ways)

    def _store_missing(self, subject: str, e: StoreMissing) -> SeatUnavailable:
        ways = [
            f"put the folder back: {e.path} with {e.expected} (from a backup of that node's disk)",
            f"`meshctl seat restore {self.seat} --node {self.node}`: a replicated seat's store comes back "
            "from its replica",
            f"`meshctl seat adopt {self.seat} --node {self.node}`: start a new, empty store here, on purpose "
            f"(ids and entries of {e.expected} are not in it)",
        ]
        facts = {
            "id": e.home.store,
            "node": e.home.store_node,
            "since": e.home.store_since,
            "path": str(e.path),
            "found": e.found,
        }
        why = f"it is kept in {e.expected}, and {e.path} holds {e.found}"
        return SeatUnavailable(subject, self.seat, self.module, self.node, "", why, ways, store=facts)

    async def _answer_503(self, msg: Msg) -> None:
        if not msg.reply:
            return
        data, headers = render(self.unavailable(msg.subject))
        try:
            await self.nc.publish(msg.reply, data, headers=headers)
        except Exception as e:  # the bus went away: the caller's own timeout answers it
            log.warning("could not answer %s: %s", msg.subject, e)

    # --- the end -----------------------------------------------------------------------------
    async def close(self, release: bool = True) -> None:
        """Stop; a held lease is deleted (fenced by its revision) so a successor need not wait."""
        self._closed = True
        self._woken.set()
        await self._standby_answers(False)
        if self._held is not None and release and self.data is not None:
            try:
                await self.data.stop_clean()  # its last writes reach the replica before the lease goes
            except Exception as e:
                log.warning("seat %s: the clean stop of its store failed (%s)", self.seat, e)
        if not release and self.data is not None:
            self.data.kill_now()
        held, self._held = self._held, None
        if held is not None and release:
            try:
                await self.leases.release(held)
                log.info("seat %s: lease released by node %s", self.seat, self.node)
            except Exception as e:  # the lease expires by itself
                log.warning(
                    "seat %s: could not release the lease (%s); it expires within %g s", self.seat, e, self.leases.ttl_s
                )
