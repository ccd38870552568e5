"""Shared pieces of the fault suite: private nats-servers (one, or a routed cluster), calls with
retries that count what they cost, waiting with a deadline, and `meshctl` as a subprocess.

Every process started here is ended by the fixture that started it, whatever the test did.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import nats
import pytest
from nats.aio.client import Client

from runtime.bus.embedded import free_port, nats_server_binary
from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, call, stop_process, wait_port


class Server:
    """One nats-server on loopback, configured by a file so every option is spelled out."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        *,
        port: int | None = None,
        jetstream: bool = True,
        max_payload: str | None = None,
        cluster_port: int | None = None,
        routes: list[int] | None = None,
        cluster_name: str = "faults",
    ) -> None:
        self.workdir = workdir / name
        self.name = name
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.jetstream = jetstream
        self.max_payload = max_payload
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.cluster_name = cluster_name
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        lines = [
            f'listen: "127.0.0.1:{self.port}"',
            f'server_name: "{self.name}"',
            f'http: "127.0.0.1:{self.monitor_port}"',
        ]
        if self.max_payload:
            lines.append(f"max_payload: {self.max_payload}")
        if self.jetstream:
            lines.append(f'jetstream {{ store_dir: "{self.workdir / "js"}" }}')
        if self.cluster_port:
            routes = ", ".join(f'"nats://127.0.0.1:{p}"' for p in self.routes)
            lines.append(
                f'cluster {{ name: "{self.cluster_name}", listen: "127.0.0.1:{self.cluster_port}", routes: [{routes}] }}'
            )
        return "\n".join(lines) + "\n"

    def start(self) -> Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "server.conf"
        config.write_text(self.config_text())
        log = open(self.workdir / "server.log", "ab")
        self.proc = subprocess.Popen([nats_server_binary(), "-c", str(config)], stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        wait_port(self.port)
        return self

    def kill(self) -> None:
        """The server dies at once (a crash), as far as its clients can tell."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc)

    def monitor(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/{path}", timeout=5) as r:
            return json.loads(r.read())

    def peers(self) -> set[str]:
        """The other servers this one has a route to (a pool of routes per peer counts once)."""
        return {r.get("remote_id", "") for r in self.monitor("routez").get("routes") or []}

    def client_names(self) -> list[str]:
        return [c.get("name", "") for c in self.monitor("connz?limit=1024").get("connections", [])]


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """pytest's tmp_path is 0700 (root's): a process run as nobody could not reach into it."""
    path = Path(tempfile.mkdtemp(prefix="mesh-faults-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start private nats-servers for one test (to restart, kill or reconfigure); all end with it."""
    started: list[Server] = []

    def start(name: str = "nats", *, run: bool = True, **kw: Any) -> Server:
        server = Server(tmp_path / "servers", name, **kw)
        started.append(server)
        return server.start() if run else server

    yield start
    for server in started:
        server.stop()


def config(**changes: str) -> str:
    """FAST_CONFIG with some `key = value` lines replaced (keys are unique across its tables)."""
    lines = []
    for line in FAST_CONFIG.splitlines():
        key = line.split("=", 1)[0].strip()
        lines.append(f"{key} = {changes[key]}" if key in changes else line)
    return "\n".join(lines) + "\n"


async def call_retrying(
    nc: Client, subject: str, args: Any, *, per_try: float = 1.0, tries: int = 20, pause: float = 0.1
) -> tuple[int, Any, int]:
    """(code, body, tries used): retries on a bus timeout, no responders or a 503, nothing else."""
    code, body = 0, None
    for attempt in range(1, tries + 1):
        try:
            code, body = await call(nc, subject, args, timeout=per_try)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            code, body = 0, repr(e)
        except (nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError) as e:
            code, body = 0, repr(e)
        if code not in (0, 503):
            return code, body, attempt
        await asyncio.sleep(pause)
    return code, body, tries


def meshctl(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`meshctl ...` as an operator runs it: a separate process, its output captured."""
    return subprocess.run([*MESHCTL, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def start_times(log: Path) -> list[float]:
    """The start times a raw child wrote to its RAW_START_LOG file, oldest first."""
    if not log.exists():
        return []
    return [float(line.split()[0]) for line in log.read_text().splitlines() if line.strip()]
