"""`meshctl seat move SEAT --to NODE`: a disk-backed seat's data goes with it, through the object store.

The home node (it must run) stops serving the seat and releases its lease, waits for the calls
in flight on the module's bundles, packs the module's data folder into the object store
`mesh-seat-data`, and names the target as the seat's home with that object, fenced by the
home's revision. The target, at its next look at the seat, fetches the object, checks its
sha256, unpacks it beside its data folder, swaps it in (the old folder is kept aside, never
deleted), restarts the module's bundles so they open the moved store, deletes the packed object
(the bucket's TTL removes one nobody took in), and only then takes the lease. The old home stops
the module's children and moves its folder aside (`<module>.stale-<time>`): nothing stays live.
A failure before the home changes leaves the seat where it was: the home takes it again.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Protocol

import anyio
import msgspec
from nats.aio.client import Client
from nats.js import api
from nats.js.errors import BucketNotFoundError, NotFoundError

from runtime.wire.leases import HomeRecord, SeatLeases
from toolchains.artifact import sha256_file

log = logging.getLogger("mesh.seats")

DATA_BUCKET = "mesh-seat-data"
DATA_TTL_S = 24 * 3600.0  # a packed folder no target took in goes by itself after a day
IMPORTED_SUFFIX = ".imported"  # <state>/seats/<seat>.imported: the object this node last took in


class SeatMoveError(Exception):
    pass


class Restartable(Protocol):
    """What a move needs of a module's bundle: wait for its calls, restart it, see it ready."""

    state: str
    pid: int | None

    async def drain(self, timeout: float) -> None: ...

    def request_restart(self) -> None: ...


async def _data_store(nc: Client):  # type: ignore[no-untyped-def]
    js = nc.jetstream()
    try:
        return await js.object_store(DATA_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        # A packed folder lives until its target took it in, and at most DATA_TTL_S in any case.
        return await js.create_object_store(DATA_BUCKET, config=api.ObjectStoreConfig(ttl=DATA_TTL_S))


async def export_seat(
    nc: Client,
    leases: SeatLeases,
    *,
    seat: str,
    module: str,
    node: str,
    to: str,
    data_dir: Path,
    bundles: list[Restartable],
    drain_timeout_s: float,
) -> HomeRecord:
    """On the home node, the seat already stepped down: pack the data and name the new home."""
    home = await leases.home(seat)
    if home is None or not isinstance(home.record, HomeRecord) or home.record.node != node:
        where = home.record.node if home is not None and isinstance(home.record, HomeRecord) else "nowhere"
        raise SeatMoveError(f"seat {seat}'s data is on node {where}, not on node {node}")
    for bundle in bundles:
        await bundle.drain(drain_timeout_s)  # what was written before the step-down goes with the data
    obs = await _data_store(nc)
    name = f"{seat}/{node}-{uuid.uuid4().hex[:12]}.tar.gz"
    with tempfile.TemporaryDirectory(prefix="mesh-seat-move-") as tmp:
        packed = Path(tmp) / "data.tar.gz"
        await anyio.to_thread.run_sync(_pack, data_dir, packed)
        digest = sha256_file(packed)
        with open(packed, "rb") as f:
            await obs.put(name, f)
        size = packed.stat().st_size
    # The store's identity goes with it: the target serves the same store (runtime/seats/store.py).
    record = msgspec.structs.replace(
        home.record, node=to, module=module, since=time.time(), how=f"moved from {node}", data=name, sha256=digest
    )
    await leases.set_home(seat, record, home.revision)
    log.warning("seat %s: data of module %s packed (%d bytes, %s) and handed to node %s", seat, module, size, name, to)
    return record


def _pack(data_dir: Path, out: Path) -> None:
    with tarfile.open(out, "w:gz") as tar:
        if data_dir.is_dir():
            tar.add(data_dir, arcname=".")


def imported_mark(state_dir: Path, seat: str) -> Path:
    return state_dir / "seats" / f"{seat}{IMPORTED_SUFFIX}"


def needs_import(state_dir: Path, seat: str, home: HomeRecord) -> bool:
    if not home.data:
        return False
    try:
        return imported_mark(state_dir, seat).read_text().strip() != home.data
    except FileNotFoundError:
        return True


async def import_seat(
    nc: Client,
    *,
    seat: str,
    home: HomeRecord,
    state_dir: Path,
    data_dir: Path,
    bundles: list[Restartable],
    owner: tuple[str | None, str | None],
    ready_timeout_s: float,
) -> None:
    """On the new home, before it takes the lease: the moved data in, the bundles restarted on it."""
    obs = await _data_store(nc)
    staging = data_dir.with_name(f".import-{data_dir.name}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="mesh-seat-move-") as tmp:
        packed = Path(tmp) / "data.tar.gz"
        with open(packed, "wb") as f:
            await obs.get(home.data, writeinto=f)
        digest = sha256_file(packed)
        if digest != home.sha256:
            raise SeatMoveError(
                f"the data of seat {seat} ({home.data}) has sha256 {digest[:16]}..., "
                f"the home record says {home.sha256[:16]}...; not taken in"
            )
        await anyio.to_thread.run_sync(_unpack, packed, staging)
    if owner[0]:
        for path in [staging, *staging.rglob("*")]:
            shutil.chown(path, owner[0], owner[1])
    for bundle in bundles:
        await bundle.drain(ready_timeout_s)
    if data_dir.exists():
        aside = data_dir.with_name(f"{data_dir.name}.before-move-{int(time.time())}")
        os.replace(data_dir, aside)
        log.warning("seat %s: this node's own data of module %s kept aside in %s", seat, data_dir.name, aside)
    os.replace(staging, data_dir)
    mark = imported_mark(state_dir, seat)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(home.data + "\n")
    # The children opened the folder that was moved aside: they start again on the moved one.
    before = {id(b): b.pid for b in bundles}
    for bundle in bundles:
        bundle.request_restart()
    with anyio.move_on_after(ready_timeout_s):
        while not all(b.state == "ready" and b.pid != before[id(b)] for b in bundles):
            await anyio.sleep(0.05)
    log.warning("seat %s: data taken in (%s, %s); bundles restarted on it", seat, home.how, home.data)
    try:  # taken in: the packed copy (private entries included) does not stay in the bus
        await obs.delete(home.data)
    except Exception as e:  # the bucket's TTL removes it in any case
        log.warning("seat %s: could not delete the packed data %s (%s); it expires within a day", seat, home.data, e)


def _unpack(packed: Path, into: Path) -> None:
    with tarfile.open(packed, "r:gz") as tar:
        # The "data" filter refuses absolute paths, links out of the folder and device files.
        tar.extractall(into, filter="data")
