"""A replicated seat's SQLite files in JetStream, through Litestream (v0.5, its NATS object-store replica).

Each holder writes its own generation: the buckets `<prefix>-<i>` (one a database; Litestream
keeps one database a bucket), the prefix `mesh-seat-<seat>-<random>` named in the seat's home
record. A node taking the seat restores the generation the home names (Litestream's restore,
then `PRAGMA integrity_check`), names a new generation of its own in the home (fenced by the
home's revision: of two nodes taking at once, one wins) and replicates into that; once it holds
the lease it deletes the older generations. So an old holder that wakes after its lease expired
(SIGSTOP, a long pause) writes, if at all, into a generation nobody restores, whose buckets are
gone: two writers never mix one replica. A holder that loses its lease SIGKILLs its Litestream
before anything else (`Replicator.kill_now`).

After a takeover from a holder that did not stop cleanly, writes it answered in its last
`sync_interval_ms` may be missing: every AUTOINCREMENT counter skips ID_GAP ids, so an id an
agent saw is never given to another entry.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
from anyio.abc import Process
from nats.aio.client import Client
from nats.js import api
from nats.js.errors import BucketNotFoundError, NotFoundError

from runtime.config import NatsConfig

log = logging.getLogger("mesh.seats")

ID_GAP = 10_000  # ids skipped after an unclean takeover: more than a holder answers in one sync interval
RESTORE_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0  # a clean stop: Litestream's last sync


class ReplicaError(Exception):
    pass


def litestream_binary(configured: str) -> str | None:
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    beside = Path(sys.executable).parent / "litestream"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("litestream")


def new_prefix(seat: str) -> str:
    return f"mesh-seat-{seat}-{secrets.token_hex(4)}"


def buckets(prefix: str, databases: list[str]) -> list[str]:
    return [f"{prefix}-{i}" for i in range(len(databases))]


async def create_buckets(nc: Client, names: list[str], replicas: int) -> int:
    """Make the generation's buckets; the replicas used (a lone server takes 1, said once)."""
    js = nc.jetstream()
    used = replicas
    for name in names:
        try:
            await js.create_object_store(name, config=api.ObjectStoreConfig(replicas=used))
        except Exception as e:
            if used == 1 or "replicas" not in str(e).lower():
                raise
            log.warning("bucket %s: %d replicas refused by the bus (%s); 1 replica", name, used, e)
            used = 1
            await js.create_object_store(name, config=api.ObjectStoreConfig(replicas=1))
    return used


async def delete_buckets(nc: Client, names: list[str]) -> None:
    js = nc.jetstream()
    for name in names:
        try:
            await js.delete_object_store(name)
        except (BucketNotFoundError, NotFoundError):
            pass
        except Exception as e:  # a generation left behind costs space, not data
            log.warning("could not delete replica bucket %s: %s", name, e)


async def generations(nc: Client, seat: str) -> list[str]:
    """Every bucket of every generation of `seat` in JetStream."""
    found: list[str] = []
    offset = 0
    while True:
        resp = await nc.request("$JS.API.STREAM.NAMES", json.dumps({"offset": offset}).encode(), timeout=5)
        body = json.loads(resp.data)
        names = body.get("streams") or []
        # Exactly this seat's: seat "memory" must not take seat "memory-x"'s buckets for its own.
        mine = re.compile(rf"^OBJ_mesh-seat-{re.escape(seat)}-[0-9a-f]{{8}}-[0-9]+\Z")
        found += [n[len("OBJ_") :] for n in names if mine.match(n)]
        offset += len(names)
        if not names or offset >= int(body.get("total", 0)):
            break
    return found


async def bucket_exists(nc: Client, name: str) -> bool:
    try:
        await nc.jetstream().stream_info(f"OBJ_{name}")
        return True
    except NotFoundError:
        return False


async def last_sync(nc: Client, names: list[str]) -> float:
    """When the generation last received a write (the oldest of its buckets' last writes); 0 if never."""
    times = []
    for name in names:
        # nats-py's StreamState has no last_ts; the API's own answer does.
        resp = await nc.request(f"$JS.API.STREAM.INFO.OBJ_{name}", b"", timeout=5)
        state = json.loads(resp.data).get("state") or {}
        if not state.get("messages") or not state.get("last_ts"):
            return 0.0
        times.append(_unix(state["last_ts"]))
    return min(times) if times else 0.0


def _unix(stamp: object) -> float:
    if isinstance(stamp, (int, float)):
        return float(stamp)
    from datetime import datetime

    text = str(stamp).rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text + "+00:00").timestamp()


def config_text(
    data_dir: Path, meta_dir: Path, databases: list[str], names: list[str], bus: NatsConfig, sync_interval_ms: int
) -> str:
    """Litestream's YAML (written as JSON, which YAML reads): one database, one NATS bucket each."""
    url = (bus.url or "").split(",")[0].strip()
    dbs = []
    for i, (database, bucket) in enumerate(zip(databases, names)):
        # The bucket goes in the URL: v0.5.18 reads an empty URL path as the bucket ".".
        replica: dict[str, object] = {"type": "nats", "url": f"{_host_url(url)}/{bucket}", "bucket": bucket}
        replica["sync-interval"] = f"{sync_interval_ms}ms"
        for key, value in (
            ("username", bus.user),
            ("password", bus.password),
            ("token", bus.token),
            ("creds", bus.creds),
        ):
            if value:
                replica[key] = value
        if bus.tls_ca:
            replica["root-cas"] = [bus.tls_ca]
        if bus.tls_cert and bus.tls_key:
            replica["client-cert"], replica["client-key"] = bus.tls_cert, bus.tls_key
        # monitor-interval: how often it looks at the WAL (default 1 s), which adds to the sync
        # interval in the RPO; 100 ms keeps the RPO near sync_interval_ms for a look costing little.
        dbs.append(
            {
                "path": str(data_dir / database),
                "meta-path": str(meta_dir / str(i)),
                "monitor-interval": "100ms",
                "replica": replica,
            }
        )
    # Logs at WARN: its INFO lines are one a sync.
    return json.dumps({"dbs": dbs, "logging": {"level": "warn"}}, indent=1)


def _host_url(url: str) -> str:
    """scheme://host:port of the bus URL, without credentials (they go in their own fields)."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme or 'nats'}://{host}"


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the bus's credentials
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)
    return path


async def restore(binary: str, config: Path, db_path: Path, out: Path, timestamp: str = "") -> bool:
    """Litestream's restore of one database into `out`; False when the replica holds nothing yet."""
    argv = [binary, "restore", "-config", str(config), "-o", str(out), "-if-replica-exists"]
    if timestamp:
        argv += ["-timestamp", timestamp]
    argv.append(str(db_path))
    with anyio.fail_after(RESTORE_TIMEOUT_S):
        done = await anyio.run_process(argv, check=False)
    if done.returncode != 0:
        said = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
        raise ReplicaError(f"litestream restore of {db_path.name} failed (exit {done.returncode}): {' | '.join(said)}")
    return out.exists()


def integrity(path: Path) -> str:
    """`PRAGMA integrity_check` of a restored file: "ok" or what SQLite says is wrong."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("PRAGMA integrity_check").fetchall()
    finally:
        db.close()
    return "; ".join(str(r[0]) for r in rows[:5])


def skip_ids(path: Path, gap: int = ID_GAP) -> int:
    """Every AUTOINCREMENT counter of the file moves `gap` ids on; the counters moved."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        has = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone()
        if not has:
            return 0
        return db.execute("UPDATE sqlite_sequence SET seq = seq + ?", (gap,)).rowcount
    finally:
        db.close()


class Replicator:
    """One Litestream process replicating one seat's databases; restarted when it dies by itself."""

    def __init__(self, seat: str, binary: str, config: Path, log_path: Path) -> None:
        self.seat, self.binary, self.config, self.log_path = seat, binary, config, log_path
        self.process: Process | None = None
        self._stopping = False
        self.finished = anyio.Event()
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def run(self) -> None:
        """Owned by the seats' task group: start it, and again after an exit of its own."""
        try:
            while not self._stopping:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.log_path, "ab") as out:
                    await self._once(out)
                if not self._stopping:
                    await anyio.sleep(1.0)
        finally:
            self.finished.set()

    async def _once(self, out: IO[bytes]) -> None:
        self.starts += 1
        argv = [self.binary, "replicate", "-config", str(self.config)]
        setpriv = shutil.which("setpriv")
        if setpriv:  # it dies with the node (kill -9 included): no orphan writes into an old generation
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        self.process = await anyio.open_process(argv, stdin=None, stdout=out, stderr=out)
        if self._stopping:  # killed while it was being started
            self.process.kill()
        code = await self.process.wait()
        if not self._stopping:
            log.error(
                "seat %s: litestream exited by itself (%s); started again in 1 s (its log: %s)",
                self.seat,
                code,
                self.log_path,
            )

    def kill_now(self) -> None:
        """SIGKILL, at once and synchronously: nothing more of this holder reaches the replica."""
        self._stopping = True
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    async def stop(self) -> bool:
        """A clean stop: SIGTERM, Litestream's last sync; True when it ended by itself in time."""
        self._stopping = True
        proc = self.process
        if proc is None or proc.returncode is not None:
            return proc is not None and proc.returncode == 0
        proc.terminate()
        with anyio.move_on_after(STOP_TIMEOUT_S):
            code = await proc.wait()
            return code == 0
        self.kill_now()
        return False
