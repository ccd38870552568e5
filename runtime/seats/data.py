"""What a stateful seat's data needs before, while and after this node holds it (runtime/seats/keeper.py asks).

Before the lease is taken (`prepare`): the store is made (the first holder mesh-wide: a new store
id in the home record and the folder), checked (a `local` seat: the folder must carry the id the
home names, else StoreMissing and nothing is touched), or restored (a `replicated` seat: whatever
the folder holds goes aside, the home's generation is restored and checked, a new generation is
named); then the module's steps and tools children start on it, then (replicated) its Litestream.
Only then does the keeper take the lease. On loss (`kill_now`, then `after_loss`) Litestream is
SIGKILLed first, then the children stop and the folder goes aside. A clean stop (`stop_clean`)
stops the children, lets Litestream ship its last writes and marks the home clean.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Awaitable, Callable

import anyio
import anyio.abc
import msgspec
from nats.aio.client import Client

from runtime.config import NatsConfig, SeatsConfig
from runtime.hosting.placement import made_data_dir
from runtime.seats import replica
from runtime.seats.replica import ReplicaError, Replicator
from runtime.seats.store import StoreMissing, matches, move_aside, new_store_id, what_is_there, write_identity
from runtime.wire.leases import NEWEST, Found, HomeRecord, SeatLeases

log = logging.getLogger("mesh.seats")


class SeatData:
    """One stateful seat's store on this node."""

    def __init__(
        self,
        *,
        nc: Client,
        leases: SeatLeases,
        seat: str,
        module: str,
        node: str,
        failover: str,
        databases: list[str],
        data_dir: Path,
        state_dir: Path,
        seats_config: SeatsConfig,
        bus: NatsConfig | None,
        owner: tuple[str | None, str | None],
        start_module: Callable[[], Awaitable[None]],
        stop_module: Callable[[], Awaitable[None]],
        tg: anyio.abc.TaskGroup,
    ) -> None:
        self.nc, self.leases = nc, leases
        self.seat, self.module, self.node = seat, module, node
        self.failover, self.databases = failover, databases
        self.data_dir, self.state_dir = data_dir, state_dir
        self.config, self.bus, self.owner = seats_config, bus, owner
        self.start_module, self.stop_module = start_module, stop_module
        self._tg = tg
        self.replicator: Replicator | None = None
        self.prefix = ""  # this node's generation, while it replicates
        self._retired: list[str] = []  # buckets of the generation restored: deleted once the lease is held

    @property
    def keeps_folder(self) -> bool:
        return self.failover == "local" or bool(self.databases)

    @property
    def replicated(self) -> bool:
        return self.failover == "replicated" and bool(self.databases)

    def _binary(self) -> str:
        found = replica.litestream_binary(self.config.litestream)
        if found is None:
            raise ReplicaError(
                "litestream is not installed (a replicated seat needs it): run scripts/setup-litestream.sh, "
                "or name it in [seats] litestream"
            )
        return found

    # --- before the lease ----------------------------------------------------------------------
    async def prepare(self, home: Found | None) -> HomeRecord | None:
        """The store here, its children started; None when another node changed the home meanwhile."""
        if not self.keeps_folder:  # its data is elsewhere (a replicated seat without databases)
            await self.start_module()
            return HomeRecord(self.node, self.module, time.time())
        if home is None or not isinstance(home.record, HomeRecord):
            return await self._first(None)
        record = home.record
        if not record.store:  # a home from before store ids, or an operator's adopt: this folder is the store
            return await self._first(home)
        if not self.replicated:
            if not matches(self.data_dir, self.seat, record):
                raise StoreMissing(self.seat, record, self.data_dir, what_is_there(self.data_dir, self.seat))
            await self.start_module()
            return record
        return await self._take_over(home, record)

    async def _first(self, home: Found | None) -> HomeRecord | None:
        now = time.time()
        old = home.record if home is not None and isinstance(home.record, HomeRecord) else None
        record = HomeRecord(
            node=self.node,
            module=self.module,
            since=now,
            how=old.how if old is not None else "first holder",
            store=new_store_id(),
            store_node=self.node,
            store_since=now,
            replica=replica.new_prefix(self.seat) if self.replicated else "",
        )
        names = replica.buckets(record.replica, self.databases) if self.replicated else []
        if names:
            self._binary()
            await replica.create_buckets(self.nc, names, self._replicas())
        try:
            if home is None:
                settled = await self.leases.settle_home(self.seat, record)
            else:
                await self.leases.set_home(self.seat, record, home.revision)
                settled = record
        except Exception:
            settled = None
        if settled is None or settled.store != record.store:
            await replica.delete_buckets(self.nc, names)
            return None
        if self._holds_files():
            log.warning(
                "seat %s: %s becomes store %s with the files it holds (%s)",
                self.seat,
                self.data_dir,
                record.store,
                what_is_there(self.data_dir, self.seat),
            )
        self._made_folder()
        write_identity(self.data_dir, self.seat, record)
        log.info("seat %s: store %s made on node %s in %s", self.seat, record.store, self.node, self.data_dir)
        await self._start(record)
        return record

    async def _take_over(self, home: Found, record: HomeRecord) -> HomeRecord | None:
        if record.restore_at and record.node != self.node:
            return None  # an operator asked another node to restore it
        binary = self._binary()
        names = replica.buckets(record.replica, self.databases)
        for name in names:
            if not await replica.bucket_exists(self.nc, name):
                raise StoreMissing(
                    self.seat,
                    record,
                    self.data_dir,
                    what_is_there(self.data_dir, self.seat),
                    more=f"; and its replica, JetStream bucket {name}, is missing",
                )
        if self._holds_files():
            if record.clean and record.node == self.node and matches(self.data_dir, self.seat, record):
                shutil.rmtree(self.data_dir)  # this node's own copy after a clean stop: the replica holds it all
            else:
                aside = move_aside(self.data_dir)
                log.warning("seat %s: the copy on this node was moved aside to %s, never served", self.seat, aside)
        staging = self.data_dir.with_name(f".restore-{self.data_dir.name}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        started = time.monotonic()
        config = self._config(staging, names, "restore")
        for database in self.databases:
            at = "" if record.restore_at == NEWEST else record.restore_at
            got = await replica.restore(binary, config, staging / database, staging / database, at)
            if got:
                said = await anyio.to_thread.run_sync(replica.integrity, staging / database)
                if said != "ok":
                    raise ReplicaError(f"the restored {database} fails PRAGMA integrity_check: {said}")
                if not record.clean:
                    await anyio.to_thread.run_sync(replica.skip_ids, staging / database)
        new = msgspec.structs.replace(
            record,
            node=self.node,
            since=time.time(),
            how=f"taken over from node {record.node}" + (" (clean stop)" if record.clean else ""),
            replica=replica.new_prefix(self.seat),
            clean=False,
            restore_at="",
        )
        fresh = replica.buckets(new.replica, self.databases)
        await replica.create_buckets(self.nc, fresh, self._replicas())
        try:
            await self.leases.set_home(self.seat, new, home.revision)
        except Exception as e:  # another node took the seat's next generation first
            log.info("seat %s: another node names the next generation (%s); looking again", self.seat, e)
            await replica.delete_buckets(self.nc, fresh)
            shutil.rmtree(staging, ignore_errors=True)
            return None
        os.replace(staging, self.data_dir)
        self._made_folder()
        write_identity(self.data_dir, self.seat, new)
        log.warning(
            "seat %s: store %s restored from node %s's replica in %.2f s%s",
            self.seat,
            new.store,
            record.node,
            time.monotonic() - started,
            "" if record.clean else f" (not a clean stop: ids skip {replica.ID_GAP})",
        )
        self._retired = names
        await self._start(new)
        return new

    async def _start(self, record: HomeRecord) -> None:
        await self.start_module()
        if self.replicated:
            self.prefix = record.replica
            names = replica.buckets(record.replica, self.databases)
            config = self._config(self.data_dir, names, "replicate")
            self.replicator = Replicator(
                self.seat, self._binary(), config, self.state_dir / "seats" / self.seat / "litestream.log"
            )
            self._tg.start_soon(self.replicator.run)

    # --- held -------------------------------------------------------------------------------------
    async def held(self) -> None:
        """The lease is this node's: every other generation goes (an old holder's writes land nowhere)."""
        if not self.replicated:
            return
        current = set(replica.buckets(self.prefix, self.databases))
        try:
            others = [b for b in await replica.generations(self.nc, self.seat) if b not in current]
        except Exception as e:
            log.warning("seat %s: could not list old generations (%s)", self.seat, e)
            others = self._retired
        await replica.delete_buckets(self.nc, others)
        self._retired = []

    async def sync_facts(self) -> tuple[float, float]:
        """(when the replica last took a write, how many seconds the database is ahead of it)."""
        if not self.replicated or not self.prefix:
            return 0.0, 0.0
        synced = await replica.last_sync(self.nc, replica.buckets(self.prefix, self.databases))
        newest = 0.0
        for database in self.databases:
            for path in (self.data_dir / database, self.data_dir / f"{database}-wal"):
                try:
                    newest = max(newest, path.stat().st_mtime)
                except OSError:
                    pass
        return synced, max(0.0, newest - synced) if synced else 0.0

    # --- the end --------------------------------------------------------------------------------
    def kill_now(self) -> None:
        if self.replicator is not None:
            self.replicator.kill_now()

    async def after_loss(self) -> None:
        """The lease is lost (or was never got): children stop, the copy goes aside, never served again."""
        self.kill_now()
        await self.stop_module()
        if self.replicated:
            aside = move_aside(self.data_dir)
            if aside is not None:
                log.warning("seat %s: this node's copy moved aside to %s", self.seat, aside)
        self.replicator, self.prefix = None, ""

    async def stop_clean(self) -> None:
        """A clean stop: no more writes, Litestream's last sync, the home marked clean."""
        if self.replicator is None:
            return
        await self.stop_module()
        shipped = await self.replicator.stop()
        self.replicator = None
        if not shipped:
            log.warning("seat %s: litestream did not finish its last sync; the next holder skips ids", self.seat)
            return
        home = await self.leases.home(self.seat)
        if home is not None and isinstance(home.record, HomeRecord) and home.record.replica == self.prefix:
            try:
                await self.leases.set_home(self.seat, msgspec.structs.replace(home.record, clean=True), home.revision)
            except Exception as e:
                log.warning("seat %s: could not mark the stop clean (%s)", self.seat, e)

    # --- helpers ----------------------------------------------------------------------------------
    def _holds_files(self) -> bool:
        return self.data_dir.is_dir() and any(self.data_dir.iterdir())

    def _made_folder(self) -> None:
        user, group = self.owner
        made_data_dir(self.state_dir, self.data_dir.name, user, group)
        if user:
            for path in self.data_dir.rglob("*"):
                shutil.chown(path, user, group)

    def _replicas(self) -> int:
        return self.config.replicas or 3  # a lone server refuses 3: create_buckets takes 1 then

    def _config(self, data_dir: Path, names: list[str], what: str) -> Path:
        if self.bus is None:
            raise ReplicaError("the node's bus settings are not known; a replicated seat cannot replicate")
        text = replica.config_text(
            data_dir,
            self.state_dir / "seats" / self.seat / "meta",
            self.databases,
            names,
            self.bus,
            self.config.sync_interval_ms,
        )
        return replica.write_config(self.state_dir / "seats" / self.seat / f"litestream-{what}.yml", text)
