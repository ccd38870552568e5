"""What the handoff tests share: the bundle built once, a nats-server with one account per caller,
a node serving bundles/handoff on it, each caller on its own connection, and the child driven
over stdio as the node drives it (a second process on the node's own store, for the fencing and
the clocks).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from runtime.bus.accounts import accounts_block
from tests.faults.security_support import ConfiguredServer
from tests.support.mesh import FAST_CONFIG, NodeProcess, client, wait_state
from tests.support.sdk import build_context, facts_env
from tests.support.stdio_client import StdioClient
from toolchains.go import TOOLCHAIN

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "bundles" / "handoff"
V0_DUMP = REPO / "tests" / "data" / "handoff_v0.sql"
PASSWORD = "handoff-test"
MESH_USER = "mesh"
# The bounds the module documents (bundles/handoff/README.md, "Bounds").
LONG_CHARS, LONG_BYTES = 8000, 16384
MAX_PAGE_BYTES = 512 * 1024
NATS_MAX_PAYLOAD = 1024 * 1024


def caller_id(caller: dict[str, Any]) -> str:
    return f"{caller['account']}/{caller['user']}" if caller["user"] else caller["account"]


def build_stage(base: Path) -> Path:
    """bin/handoff built from this checkout into base/stage."""
    TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage", base / "cache"))
    return base / "stage"


def accounts_server(workdir: Path, callers: list[dict[str, Any]]) -> ConfiguredServer:
    """The mesh account (the node's, user `mesh`) exporting the mesh's services, and one account per
    caller importing them with share: true, so the server stamps every request with the caller's
    account and user. A connection as `mesh` is inside the mesh account: its calls carry the node's
    local identity (`@local`)."""
    users = [(c["account"], c["user"], PASSWORD) for c in callers]
    return ConfiguredServer(workdir, accounts_block([(MESH_USER, PASSWORD)], users)).start()


def url_of(server: ConfiguredServer, caller: dict[str, Any] | None) -> str:
    user = caller["user"] if caller else MESH_USER
    return f"nats://{user}:{PASSWORD}@127.0.0.1:{server.port}"


def start_node(
    tmp_path: Path,
    server: ConfiguredServer,
    name: str,
    env: dict[str, str],
    *,
    manifests: Path = MODULE_DIR,
    local: str | None = None,
    drain_timeout_s: int = 10,
) -> NodeProcess:
    """A node serving bundles/handoff (or what `manifests` holds), ready: the first start builds it
    (SQLite takes a minute cold). `local` is the node's local identity ([identity] local)."""
    config = FAST_CONFIG.replace("drain_timeout_s = 10", f"drain_timeout_s = {drain_timeout_s}")
    config += f'[nats]\nuser = "{MESH_USER}"\npassword = "{PASSWORD}"\n'
    if local:
        config += f'[identity]\nlocal = "{local}"\n'
    node = NodeProcess(tmp_path, manifests, server.url, name, config=config, env=env)
    node.wait_log("serving on", timeout=600)
    if manifests != MODULE_DIR:
        return node

    async def ready() -> None:
        nc = await client(url_of(server, None))
        try:
            await wait_state(nc, name, "handoff/tools", "ready", timeout=600)
        finally:
            await nc.close()

    asyncio.run(ready())
    return node


def node_store(node: NodeProcess) -> Path:
    """The folder of the node's handoff.db (MESH_DATA_DIR of its child)."""
    return node.state_dir / "data" / "handoff"


class BusCaller:
    """One caller's own connection; `call` is a request on mesh.seat.handoff.<verb>, answered
    with the CallToolResult."""

    def __init__(self, server: ConfiguredServer, caller: dict[str, Any] | None) -> None:
        self.url = url_of(server, caller)

    def call(self, verb: str, **arguments: Any) -> dict[str, Any]:
        return self.raw(verb, arguments)[0]

    def raw(self, verb: str, arguments: dict[str, Any], timeout: float = 15) -> tuple[dict[str, Any], int]:
        """The result and the size of the reply on the bus, in bytes."""

        async def go() -> tuple[dict[str, Any], int]:
            nc = await client(self.url)
            try:
                msg = await nc.request(f"mesh.seat.handoff.{verb}", json.dumps(arguments).encode(), timeout=timeout)
            finally:
                await nc.close()
            assert not (msg.headers and "Nats-Service-Error-Code" in msg.headers), (msg.headers, msg.data[:2000])
            return json.loads(msg.data), len(msg.data)

        return asyncio.run(go())

    def ok(self, verb: str, **arguments: Any) -> Any:
        result = self.call(verb, **arguments)
        assert not result.get("isError"), result["content"]
        return result["structuredContent"]

    def refused(self, verb: str, **arguments: Any) -> str:
        result = self.call(verb, **arguments)
        assert result.get("isError") is True, result
        text: str = result["content"][0]["text"]
        return text


class Seat:
    """A caller's connection kept open, for tests with calls in flight at once (async)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, server: ConfiguredServer, caller: dict[str, Any] | None) -> Seat:
        return cls(await nats.connect(url_of(server, caller)))

    async def call(self, verb: str, *, timeout: float = 15, **arguments: Any) -> dict[str, Any]:
        msg = await self.nc.request(f"mesh.seat.handoff.{verb}", json.dumps(arguments).encode(), timeout=timeout)
        assert not (msg.headers and "Nats-Service-Error-Code" in msg.headers), (msg.headers, msg.data[:2000])
        result: dict[str, Any] = json.loads(msg.data)
        return result

    async def ok(self, verb: str, *, timeout: float = 15, **arguments: Any) -> Any:
        result = await self.call(verb, timeout=timeout, **arguments)
        assert not result.get("isError"), result["content"]
        return result["structuredContent"]

    async def refused(self, verb: str, **arguments: Any) -> str:
        result = await self.call(verb, **arguments)
        assert result.get("isError") is True, result
        text: str = result["content"][0]["text"]
        return text

    async def close(self) -> None:
        await self.nc.close()


class StdioDesk:
    """The handoff child over stdio; each call says who makes it, as the node would."""

    def __init__(self, stage: Path, data: Path, env: dict[str, str] | None = None) -> None:
        self.client = StdioClient(
            [str(stage / "bin" / "handoff")], cwd=stage, env=facts_env("handoff", stage, data, **(env or {}))
        )
        self.client.initialize()

    def call(self, who: dict[str, Any] | None, verb: str, **arguments: Any) -> dict[str, Any]:
        meta = {"mesh/caller": who} if who else None
        return self.client.call(f"handoff.{verb}", arguments, meta=meta)

    def ok(self, who: dict[str, Any] | None, verb: str, **arguments: Any) -> Any:
        result = self.call(who, verb, **arguments)
        assert not result.get("isError"), result["content"]
        return result["structuredContent"]

    def refused(self, who: dict[str, Any] | None, verb: str, **arguments: Any) -> str:
        result = self.call(who, verb, **arguments)
        assert result.get("isError") is True, result
        text: str = result["content"][0]["text"]
        return text

    def stderr(self) -> str:
        """What the child said, once it has ended."""
        assert self.client.proc.stderr is not None
        return self.client.proc.stderr.read().decode(errors="replace")


def write_v0_store(folder: Path, flood: int = 0, flood_bytes: int = 1_000_000, age_s: float = 7200) -> None:
    """A store as handoff 0.1 left it (tests/data/handoff_v0.sql, captured from a run of 0.1:
    h-1 resolved, h-2 blocked after a follow-up, h-3 escalated, h-4 claimed, h-5 open), its times
    moved so that the last step was age_s ago, plus `flood` entries with a `frage` of flood_bytes
    each, as 0.1 accepted them (issue 25's flood)."""
    folder.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(folder / "handoff.db")
    try:
        db.executescript(V0_DUMP.read_text())
        bodies = {num: json.loads(body) for num, body in db.execute("SELECT num, body FROM entries")}
        last = max(_at(line["at"]) for body in bodies.values() for line in body["log"])
        shift = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=age_s) - last
        for num, body in bodies.items():
            for key in ("opened_at", "claimed_at"):
                if key in body:
                    body[key] = _stamp(_at(body[key]) + shift)
            for line in body["log"]:
                line["at"] = _stamp(_at(line["at"]) + shift)
            db.execute("UPDATE entries SET body = ? WHERE num = ?", (json.dumps(body), num))
        template = bodies[5]
        for _ in range(flood):
            (num,) = db.execute(
                "INSERT INTO entries (state, projekt, body) VALUES ('open', 'flood', '') RETURNING num"
            ).fetchone()
            body = {**template, "id": f"h-{num}", "projekt": "flood", "frage": "x" * flood_bytes}
            db.execute("UPDATE entries SET id = ?, body = ? WHERE num = ?", (f"h-{num}", json.dumps(body), num))
        db.commit()
    finally:
        db.close()


def _at(stamp: str) -> datetime.datetime:
    """Go's RFC 3339 with nanoseconds, read to microseconds."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(f"{head}.{(frac or '0')[:6]:0<6}+00:00")


def _stamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
