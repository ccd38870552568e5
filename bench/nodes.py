"""The bus and the nodes of a run: a nats-server on loopback and `meshctl node run` processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import nats
from nats.aio.client import Client

from .procs import Proc, free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent


def node_source() -> Path:
    """The checkout whose node is measured: this one, or BENCH_NODE_SOURCE (a patched copy, to
    measure a change to the node before it lands)."""
    return Path(os.environ.get("BENCH_NODE_SOURCE") or ROOT).resolve()


def meshctl() -> list[str]:
    if node_source() != ROOT:
        # Run from that folder: its runtime/ comes first (before issue 8 the CLI was runtime/cli.py).
        cli = "runtime.meshctl" if (node_source() / "runtime" / "meshctl").is_dir() else "runtime.cli"
        return [sys.executable, "-m", cli]
    beside = Path(sys.executable).parent / "meshctl"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("meshctl")
    return [found] if found else [sys.executable, "-m", "runtime.meshctl"]


def start_nats(workdir: Path) -> tuple[Proc, str]:
    from runtime.bus.embedded import nats_server_binary

    port = free_port()
    argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir / "nats-js")]
    proc = Proc("nats-server", argv, workdir / "logs" / "nats-server.log")
    wait_port(port, 10, proc.popen, "nats-server")
    return proc, f"nats://127.0.0.1:{port}"


def start_node(workdir: Path, manifests: Path, url: str, name: str, fresh: bool = True,
               extra: list[str] | None = None, env: dict[str, str] | None = None) -> Proc:
    """`meshctl node run` on the given bus with the default config; its state folder is fresh, or
    kept from the node's previous start (as a node's state folder is kept across its restarts).
    `extra`: more flags (e.g. --metrics); `env`: more environment (e.g. OTEL_*)."""
    state = workdir / f"state-{name}"
    if fresh:
        shutil.rmtree(state, ignore_errors=True)
    argv = [*meshctl(), "node", "run", "--manifests", str(manifests), "--nats", url, "--name", name,
            "--state-dir", str(state), *(extra or [])]
    return Proc(f"node {name}", argv, workdir / "logs" / f"node-{name}.log", cwd=node_source(),
                env={**os.environ, **env} if env else None)


async def connect(url: str) -> Client:
    return await nats.connect(url, name="bench-client", max_reconnect_attempts=-1, reconnect_time_wait=0.2)


async def status(nc: Client, node: str, timeout: float = 5) -> dict[str, Any] | None:
    """The node's status, or None while it does not answer yet."""
    try:
        msg = await nc.request(f"mesh.node.{node}.status", b"", timeout=timeout)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return None
    return json.loads(msg.data)


def bundle_key(b: dict[str, Any]) -> str:
    return f"{b['module']}/{b['bundle']}"


async def wait_settled(nc: Client, node: Proc, name: str, expected: int, timeout: float,
                       progress: Callable[[str], None]) -> dict[str, Any]:
    """Wait until every one of `expected` bundles is ready or failed; report progress meanwhile."""
    deadline = time.monotonic() + timeout
    said = 0.0
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        if not node.alive():
            raise RuntimeError(f"node {name} exited (code {node.popen.returncode}):\n{node.tail()}")
        last = await status(nc, name, timeout=2)
        if last is not None:
            states = [b["state"] for b in last["bundles"]]
            if len(states) >= expected and all(s in ("ready", "failed") for s in states):
                return last
            if time.monotonic() - said > 15:
                said = time.monotonic()
                counts = {s: states.count(s) for s in sorted(set(states))}
                progress(f"  node {name}: {counts} (compiled bundles are built from source first)")
        await asyncio.sleep(0.2)
    raise RuntimeError(f"node {name}: bundles not settled within {timeout:g} s; last status: {last}")
