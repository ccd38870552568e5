"""The node's part of the catalogue: what it serves, in its own keys of `mesh-catalog`.

Each round (a poke from anything that changes what the node serves, coalesced over
`COALESCE_S`, and at least every beat) computes every entry the node should have
(runtime/wire/catalog.py) and writes only what differs from what it last wrote: a bundle's
restart is its state record, a few hundred bytes; its definitions are written only when its
tools change. Order keeps readers whole: new definitions first, then the state records that
point at them, the node record, the beat, and last the purge of what is no longer true.

At start it reads what its previous run left (its own keys only) so that unchanged definitions
are not written again; on a clean stop it purges all its keys (the beat first: readers drop the
node at once). A node that dies stops beating: the server removes its beat after its TTL.
Every `AUDIT_S` it asks the stream which of its keys are there, and writes again what went
missing (a bucket made anew, an operator's purge). The bus being away is one WARNING; rounds go on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import anyio
import msgspec
from nats.aio.client import Client

from runtime.bus.catalog import CatalogUnavailable, Entry, open_bucket, scan, where
from runtime.node.modules import ModuleHost
from runtime.seats.seats import shown_state
from runtime.wire.catalog import (
    BEAT_S,
    BEAT_TTL_S,
    BUCKET_MAX_BYTES,
    ENTRY_TTL_S,
    MAX_BUNDLES_PER_NODE,
    MAX_SEATS_PER_NODE,
    MAX_TOOLS_PER_NODE,
    REFRESH_S,
    STREAM,
    TOMBSTONE_TTL_S,
    BeatRecord,
    NodeRecord,
    SeatRecord,
    StateRecord,
    ToolDef,
    beat_key,
    defs_key,
    defs_prefix,
    encode,
    node_key,
    own_keys,
    split_definitions,
    state_key,
    stored_subject,
)

log = logging.getLogger("mesh.catalog")

COALESCE_S = 0.05  # a module's bundles start together: one round for the lot
AUDIT_S = 60.0  # how often the node checks its keys are still in the bucket
RETRY_S = 1.0  # after a failed round, the next one comes this soon
LEAVING_S = 2.0  # the longest a stop waits to take the node's entries out (the beat's TTL does it otherwise)
_PURGE = {"KV-Operation": "PURGE", "Nats-Rollup": "sub"}


class CatalogWriter:
    """Keeps this node's keys of the catalogue true; `run` is a task of the node's."""

    def __init__(
        self,
        nc: Client,
        node: str,
        service_id: str,
        run_id: str,
        modules: ModuleHost,
        *,
        beat_s: float = BEAT_S,
        beat_ttl_s: int = BEAT_TTL_S,
        replicas: int = 1,
        max_bytes: int = BUCKET_MAX_BYTES,
    ) -> None:
        self.nc, self.node, self.service_id, self.run_id = nc, node, service_id, run_id
        self.modules = modules
        self.beat_s, self.beat_ttl_s, self.replicas = beat_s, beat_ttl_s, replicas
        self.max_bytes = max_bytes
        self.js = nc.jetstream()
        self.started = time.time()
        self.written: dict[str, tuple[bytes, float]] = {}  # key -> (value, unix time written): what is there
        self.writes = 0  # entries written (metrics, tests)
        self.failed_rounds = 0
        self._beat_at = 0.0  # monotonic time of the last beat
        self._audit_at = 0.0
        self._poked = anyio.Event()
        self._opened = anyio.Event()  # the bucket is there and what the last run left is known
        self._listless: list[str] = []  # key prefixes of the lists of bundles without tools now
        self._lock = anyio.Lock()  # one round at a time; the leaving waits for it
        self._closed = False
        self._said: set[str] = set()  # ERRORs said (a bound hit), each once while it lasts
        self._away = False  # the bus is away: said once

    def poke(self, reason: str = "") -> None:
        self._poked.set()

    # --- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        await self._start()
        while not self._closed:
            wait = max(0.0, self._beat_at + self.beat_s - time.monotonic())
            if self.failed_rounds:
                wait = min(wait, RETRY_S)
            with anyio.move_on_after(wait):
                await self._poked.wait()
                await anyio.sleep(COALESCE_S)
            self._poked = anyio.Event()
            await self.round()

    async def _start(self) -> None:
        """The bucket, and what this node's previous run left in it; retried until the bus answers."""
        while not self._closed:
            try:
                await open_bucket(self.js, self.replicas, self.max_bytes)
                self.written = await self._left_by_last_run()
                self._audit_at = time.monotonic()
                self._opened.set()
                self._back()
                return
            except Exception as e:  # the bus or JetStream is away: the node serves meanwhile
                self._away_once(e)
                await anyio.sleep(RETRY_S)

    async def _left_by_last_run(self) -> dict[str, tuple[bytes, float]]:
        left: dict[str, tuple[bytes, float]] = {}

        def keep(got: Entry | str) -> None:
            if isinstance(got, Entry) and got.value is not None:
                left[got.key] = (got.value, 0.0)  # its age is not known: refreshed within REFRESH_S

        await scan(self.nc, keep, own_keys(self.node))
        return left

    async def written_once(self, timeout: float) -> None:
        """Until what the node serves now is in the bucket, `timeout` at most: the node says it
        serves after this, so a face that reads the catalogue then finds it (the bus being away
        does not hold the node up: it serves, and its entries follow)."""
        with anyio.move_on_after(timeout):
            await self._opened.wait()
            await self.round()

    async def round(self) -> None:
        """Write what changed, beat when due, purge what is gone."""
        async with self._lock:
            if self._closed or not self._opened.is_set():
                return
            try:
                await self._round()
                self.failed_rounds = 0
                self._back()
            except Exception as e:  # the bus is away, or the bucket: the next round tries again
                self.failed_rounds += 1
                self._away_once(e)

    async def _round(self) -> None:
        wanted = self.wanted()
        now = time.time()
        if time.monotonic() - self._audit_at >= AUDIT_S:
            await self._audit()
        for key, value in wanted.items():
            have = self.written.get(key)
            if have is not None and have[0] == value and (have[1] == 0.0 or now - have[1] < REFRESH_S):
                if have[1] == 0.0:
                    self.written[key] = (value, now - REFRESH_S / 2)  # left by the last run: refreshed in time
                continue
            await self._put(key, value, ENTRY_TTL_S)
        if time.monotonic() - self._beat_at >= self.beat_s or beat_key(self.node) not in self.written:
            await self._put(beat_key(self.node), encode(BeatRecord(self.run_id)), self.beat_ttl_s)
            self._beat_at = time.monotonic()
        # A bundle without tools yet (starting) keeps the lists it had: the same tools, listed again,
        # need no write. They go once it lists others, or when the bundle is gone.
        keep = tuple(self._listless)
        for key in [k for k in self.written if k not in wanted and k != beat_key(self.node)]:
            if not key.startswith(keep):
                await self._purge(key)

    async def _put(self, key: str, value: bytes, ttl: int) -> None:
        await self.js.publish(stored_subject(key), value, msg_ttl=ttl)
        self.written[key] = (value, time.time())
        self.writes += 1

    async def _purge(self, key: str) -> None:
        await self.js.publish(stored_subject(key), b"", headers=dict(_PURGE), msg_ttl=TOMBSTONE_TTL_S)
        self.written.pop(key, None)
        self.writes += 1

    async def _audit(self) -> None:
        """Forget what this node wrote and is no longer there: the round writes it again."""
        info = await self.js.stream_info(STREAM, subjects_filter=stored_subject(own_keys(self.node)))
        present = set((info.state.subjects or {}).keys())
        for key in list(self.written):
            if stored_subject(key) not in present:
                log.warning("catalogue: key %s of node %s was gone from the bucket; written again", key, self.node)
                del self.written[key]
        self._audit_at = time.monotonic()

    async def leaving(self) -> None:
        """A clean stop: every key purged, the beat first; nothing is written after it."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            self._poked.set()
            keys = [beat_key(self.node)] + [k for k in self.written if k != beat_key(self.node)]
            if not self.nc.is_connected:
                log.warning(
                    "catalogue: node %s is off the bus; its beat expires within %d s", self.node, self.beat_ttl_s
                )
                return
            try:
                with anyio.fail_after(LEAVING_S):
                    for key in keys:
                        await self._purge(key)
            except Exception as e:  # the bus is gone: the beat expires by itself, readers drop the node then
                log.warning(
                    "catalogue: node %s could not take its entries out (%s: %s); its beat expires within %d s",
                    self.node,
                    type(e).__name__,
                    e,
                    self.beat_ttl_s,
                )

    # --- what the node should say ------------------------------------------------------------------
    def wanted(self) -> dict[str, bytes]:
        """Every key this node should have now but its beat, in the order they are written
        (`_listless`: the key prefixes of the lists of its bundles that have no tools now)."""
        modules = self.modules
        table = modules.table
        by_bundle: dict[tuple[str, str], list[ToolDef]] = defaultdict(list)
        for route in table.routes.values():
            by_bundle[(route.module, route.bundle.spec.name)].append(
                ToolDef(route.subject, route.kind, route.tool, msgspec.Raw(route.definition_json.encode()))
            )
        defs: dict[str, bytes] = {}
        states: dict[str, bytes] = {}
        bundles: list[str] = []
        listless: list[str] = []
        room = MAX_TOOLS_PER_NODE
        problems: set[str] = set()
        for entry in table.modules.values():
            standing = modules.seats.standing(entry)
            for bundle in entry.bundles:
                name = bundle.spec.name
                if len(bundles) >= MAX_BUNDLES_PER_NODE:
                    problems.add(
                        f"node {self.node} runs more than {MAX_BUNDLES_PER_NODE} tools bundles: "
                        f"{entry.name}/{name} and later ones are not in the catalogue (they are served)"
                    )
                    continue
                split = split_definitions(entry.name, name, by_bundle.get((entry.name, name), []), room)
                room -= split.tools
                if not split.digest:
                    listless.append(defs_prefix(self.node, entry.name, name))
                for i, part in enumerate(split.parts):
                    defs[defs_key(self.node, entry.name, name, split.digest, i)] = part
                if split.left_out:
                    problems.add(
                        f"bundle {entry.name}/{name} on node {self.node}: {len(split.left_out)} tools are served but "
                        f"not in the catalogue (faces do not list them): {'; '.join(split.left_out[:5])}"
                    )
                state = StateRecord(
                    module=entry.name,
                    bundle=name,
                    version=entry.version,
                    state=shown_state(bundle.state, standing),
                    digest=split.digest,
                    parts=len(split.parts),
                    tools=split.tools,
                    restarts=bundle.restarts,
                    left_out=len(split.left_out),
                )
                states[state_key(self.node, entry.name, name)] = encode(state)
                bundles.append(f"{entry.name}/{name}")
        self._say(problems)
        self._listless = listless
        at = where(self.nc)
        seats = [
            SeatRecord(s.seat, s.module, s.state, s.holder)
            for s in sorted(modules.seats.status.values(), key=lambda s: s.seat)
        ][:MAX_SEATS_PER_NODE]
        record = NodeRecord(
            node=self.node,
            run=self.run_id,
            service=self.service_id,
            beat_s=self.beat_s,
            beat_ttl_s=float(self.beat_ttl_s),
            started=round(self.started, 3),
            cluster=at.cluster,
            server=at.server,
            domain=at.domain,
            seats=seats,
            bundles=bundles,
        )
        return {**defs, **states, node_key(self.node): encode(record)}

    def _say(self, problems: set[str]) -> None:
        for problem in problems - self._said:
            log.error("%s", problem)
        self._said = problems

    def _away_once(self, e: BaseException) -> None:
        if not self._away:
            self._away = True
            why = str(e) if isinstance(e, CatalogUnavailable) else f"{type(e).__name__}: {e}"
            log.warning("catalogue: node %s cannot write its entries (%s); trying again", self.node, why)

    def _back(self) -> None:
        if self._away:
            self._away = False
            log.warning("catalogue: node %s writes its entries again", self.node)
