"""The catalogue, read once and then followed: what MCP faces and `meshctl tools` list.

`CatalogWatcher.run` subscribes to `mesh.catalog.>` (every write the server republishes), then
reads the whole bucket (runtime/bus/catalog.py `scan`: it says when it is whole, no window) and
says started: `tools()` is every tool of every live node. From then on each write is one message,
applied as it comes (runtime/bus/catalog_view.py); `settle_s` after a burst, `on_change` is told
what changed, once. The republished writes come one sequence after another: a missing one
(a slow reader, a reconnect) or one going back (the bucket made anew) makes the watcher read the
whole bucket again (`stats.resyncs`), at most once every `RESYNC_MIN_S`. A node's beat not written
again within its TTL is gone even if the server's marker was lost (`SWEEP_S`).

For a face (docs/scale.md, "A face's use"): run it in the face's task group on the face's own
connection, build the list from `tools()` (or `infos()`, the `$SRV.INFO` shape the face reads
today) when started, and again in `on_change`.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Awaitable, Callable

import anyio
import anyio.abc
from nats.aio.client import Client
from nats.aio.msg import Msg

from runtime.bus.catalog import CatalogUnavailable, entry_of, scan
from runtime.bus.catalog_view import CatalogChange, CatalogView, WatchLimits
from runtime.bus.connect import settle
from runtime.wire.subjects import CATALOG_PREFIX

log = logging.getLogger("mesh.catalog")

DEFAULT_LIMITS = WatchLimits()

RESYNC_MIN_S = 2.0  # a watcher reads the whole bucket again at most this often
SWEEP_S = 1.0  # how often it looks for nodes whose beat stopped without a marker
LIVE_PENDING_MSGS = 65536  # the live subscription's bound; past it nats-py drops, and a resync follows
LIVE_PENDING_BYTES = 64 * 1024 * 1024

OnChange = Callable[[CatalogChange], Awaitable[None] | None]


class CatalogWatcher(CatalogView):
    """The catalogue on one connection; `run` is its one task, owned by the caller."""

    def __init__(
        self,
        nc: Client,
        *,
        on_change: OnChange | None = None,
        limits: WatchLimits = DEFAULT_LIMITS,
        settle_s: float = 0.02,
        resync_min_s: float = RESYNC_MIN_S,
    ) -> None:
        super().__init__(limits)
        self.nc = nc
        self.on_change = on_change
        self.settle_s, self.resync_min_s = settle_s, resync_min_s
        self.ready = False  # the first read is whole
        self.absent = ""  # why there is no catalogue on this bus yet, when there is none
        self._changed = anyio.Event()
        self._next_seq: int | None = None  # of the next republished write; None until the first
        self._resync = False
        self._reset = False

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Read the bucket, say started, then follow it until cancelled.

        The first read's failure is raised (CatalogUnavailable), unless it is only that there is no
        catalogue yet: then the list starts empty (`absent` says why) and fills as nodes write."""
        sub = await self.nc.subscribe(
            CATALOG_PREFIX + ">",
            cb=self._on_live,
            pending_msgs_limit=LIVE_PENDING_MSGS,
            pending_bytes_limit=LIVE_PENDING_BYTES,
        )
        try:
            await settle(self.nc)  # subscribed before the read: no write falls between the two
            await self._read_whole(first=True)
            task_status.started()
            last_read = time.monotonic()
            while True:
                with anyio.move_on_after(SWEEP_S):
                    await self._changed.wait()
                    await anyio.sleep(self.settle_s)
                self._changed = anyio.Event()
                self.sweep(time.monotonic())
                if (self._resync or self._reset) and time.monotonic() - last_read >= self.resync_min_s:
                    last_read = time.monotonic()
                    try:
                        await self._read_whole(first=False)
                    except CatalogUnavailable as e:
                        self.note(f"the catalogue could not be read again: {e}; trying again")
                        self._resync = True
                await self._flush()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await sub.unsubscribe()
                except Exception:  # the connection is closed: so is the subscription
                    pass

    async def read_once(self) -> None:
        """One whole read, no following (`meshctl tools`): `tools()` is the catalogue as it was."""
        await self._read_whole(first=True)

    async def _read_whole(self, first: bool) -> None:
        if self._reset:
            self.clear()
        self._resync = self._reset = False
        self.begin_read()
        try:
            await scan(self.nc, self.read)
            self.absent = ""
        except CatalogUnavailable as e:
            if not first or "no catalogue on this bus" not in str(e):
                raise
            self.absent = str(e)
        finally:
            self.end_read(again=not first)
        self.stats.scans += 1
        if first:
            self.take_change()  # the first list: nobody is told, it is the start
            self.ready = True
        else:
            self.stats.resyncs += 1
            self._changed.set()

    async def _on_live(self, msg: Msg) -> None:
        got = entry_of(msg.subject, msg.headers, msg.data, CATALOG_PREFIX)
        if got is None:
            return
        if isinstance(got, str):
            self.refuse("", got)
            return
        self.stats.messages += 1
        expected = self._next_seq
        if expected is not None and got.seq != expected:
            # Lost messages (a slow reader, a reconnect), or a bucket made anew: read it again.
            if got.seq < expected:
                self._reset = True
            self._resync = True
        self._next_seq = got.seq + 1
        if not self._reset:
            self.apply(got)
        self._changed.set()

    async def _flush(self) -> None:
        change = self.take_change()
        if change is None or self.on_change is None:
            return
        try:
            done = self.on_change(change)
            if inspect.isawaitable(done):
                await done
        except Exception as e:  # the owner's callback failing is its own business; the watcher goes on
            log.warning("catalogue change callback failed: %s: %s", type(e).__name__, e)


async def read_catalog(nc: Client, limits: WatchLimits = DEFAULT_LIMITS) -> CatalogWatcher:
    """The catalogue as it is now: one whole read (CatalogUnavailable when it cannot be read)."""
    watcher = CatalogWatcher(nc, limits=limits)
    await watcher.read_once()
    return watcher
