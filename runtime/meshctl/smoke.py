"""`meshctl smoke`: the live check of record 0188 on one machine.

Start a node on its own embedded bus, build every `hello-<language>` bundle with its toolchain,
deliver the artifacts to the node over JetStream, call each one's tool over the bus, print a
table (language, tool, answer, latency). A `hello-*` module whose bundles are services
(hello-service) has no tool to call: it is delivered too, and counts when the node runs it and
it stays up (same pid, no restart) for SERVICE_STABLE_S, in a second table. Exit 0 only if
every tool answered and every service stayed up.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from nats.aio.client import Client

from manifests import load_module
from runtime.bus.connect import connect
from runtime.bus.info import read_bus_info
from runtime.config import NatsConfig
from runtime.meshctl.deliver import deliver
from toolchains.base import BuildFailed, ToolchainMissing
from toolchains.build import build_module
from toolchains.progress import BuildProgress

SERVICE_STABLE_S = 2.0


def _print(line: str) -> None:
    print(line, flush=True)


async def _call_until(nc: Client, subject: str, args: bytes, deadline: float) -> tuple[bytes | None, str]:
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            msg = await nc.request(subject, args, timeout=5)
        except Exception as e:  # no responders until the node has unpacked and started it
            last = type(e).__name__
            await asyncio.sleep(0.2)
            continue
        if msg.headers and "Nats-Service-Error-Code" in msg.headers:
            last = f"{msg.headers['Nats-Service-Error-Code']} {msg.headers.get('Nats-Service-Error', '')}"
            if msg.headers["Nats-Service-Error-Code"] in ("400", "404", "413"):
                return None, last
            await asyncio.sleep(0.2)
            continue
        return msg.data, ""
    return None, last


def run_smoke(bundles_dir: Path, timeout: float, keep: bool) -> int:
    modules = sorted(p for p in bundles_dir.glob("hello-*") if (p / "module.toml").is_file())
    if not modules:
        _print(f"smoke: no hello-* modules under {bundles_dir}")
        return 1
    work = Path(tempfile.mkdtemp(prefix="mesh-smoke-"))
    out = work / "out"
    artifacts: dict[str, list[Path]] = {}
    failures: dict[str, str] = {}
    _print(f"smoke: building {len(modules)} modules into {out}")
    with BuildProgress(lambda line: _print(f"  {line}")) as progress:
        for module_dir in modules:
            name = module_dir.name
            try:
                artifacts[name] = build_module(module_dir, out, progress=progress)
            except (ToolchainMissing, BuildFailed) as e:
                failures[name] = f"build failed: {str(e).splitlines()[0]}"
            except Exception as e:  # any other build error is this module's, reported in the table
                failures[name] = f"build failed: {type(e).__name__}: {e}"
    node_name = f"smoke-{os.getpid()}"
    state = work / "state"
    log_path = work / "node.log"
    argv = [
        sys.executable,
        "-m",
        "runtime.meshctl",
        "node",
        "run",
        "--name",
        node_name,
        "--state-dir",
        str(state),
        "--embedded-port",
        "0",
    ]
    _print(f"smoke: starting node {node_name} on an embedded bus (log: {log_path})")
    node = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
    try:
        return asyncio.run(_deliver_and_call(node, node_name, state, modules, artifacts, failures, timeout))
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
        if not keep and not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            _print(f"smoke: kept {work}")


async def _deliver_and_call(
    node: subprocess.Popen[bytes],
    node_name: str,
    state: Path,
    modules: list[Path],
    artifacts: dict[str, list[Path]],
    failures: dict[str, str],
    timeout: float,
) -> int:
    deadline = time.monotonic() + 30
    info = None
    while time.monotonic() < deadline and info is None:
        if node.poll() is not None:
            _print(f"smoke: the node exited with {node.returncode}")
            return 1
        info = read_bus_info(state)
        await asyncio.sleep(0.1)
    if info is None:
        _print("smoke: the node did not come up within 30 s")
        return 1
    # The embedded bus has accounts: delivery and status as the mesh account, the calls as the operator's caller.
    nc = await connect(_login(info.url, info.user, info.password_file), "meshctl-smoke", quiet=True)
    caller = await connect(_login(info.url, info.caller_user, info.caller_password_file), "meshctl-smoke", quiet=True)
    try:
        paths = [p for name in sorted(artifacts) for p in artifacts[name]]
        await deliver(nc, paths, node_name, None, progress=lambda line: _print(f"  {line}"))
        rows = [("LANGUAGE", "MODULE", "TOOL", "ANSWER", "LATENCY")]
        ok = True
        call_deadline = time.monotonic() + timeout
        services: list[Path] = []
        for module_dir in modules:
            name = module_dir.name
            loaded = load_module(module_dir)
            if not loaded.module.tools_bundles():
                services.append(module_dir)  # no tool to call: checked as a service below
                continue
            language = ",".join(sorted({b.language for b in loaded.module.tools_bundles()}))
            subject = f"mesh.tool.{name}.greet"
            if name in failures:
                rows.append((language, name, "greet", failures[name], "-"))
                ok = False
                continue
            body, why = await _call_until(caller, subject, b'{"name":"mesh"}', call_deadline)
            if body is None:
                rows.append((language, name, "greet", f"NO ANSWER: {why}", "-"))
                ok = False
                continue
            times = []
            for _ in range(20):
                started = time.perf_counter()
                await caller.request(subject, b'{"name":"mesh"}', timeout=5)
                times.append(time.perf_counter() - started)
            result = json.loads(body)
            text = " ".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
            if result.get("isError"):
                ok = False
                text = "ERROR: " + text
            rows.append((language, name, "greet", text[:60], f"{statistics.median(times) * 1e3:.2f} ms"))
        service_rows: list[tuple[str, ...]] = [("SERVICE", "LANGUAGE", "RUNS", "STATE", "PID", "RESTARTS")]
        for module_dir in services:
            for row in await _check_services(nc, node_name, module_dir, failures, call_deadline):
                ok = ok and row[3] == "running"
                service_rows.append(row)
        _print("")
        _table(rows)
        if services:
            _print("")
            _table(service_rows)
        _print("")
        _print(
            "smoke: " + ("every tool answered, every service runs" if ok else "NOT every tool answered or service ran")
        )
        return 0 if ok else 1
    finally:
        await caller.close()
        await nc.close()


def _login(url: str, user: str | None, password_file: str | None) -> NatsConfig:
    """A login bus.json names (the node smoke started writes it, as this same user)."""
    password = Path(password_file).read_text().strip() if password_file else None
    return NatsConfig(url=url, user=user, password=password)


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        _print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


async def _check_services(
    nc: Client, node_name: str, module_dir: Path, failures: dict[str, str], deadline: float
) -> list[tuple[str, ...]]:
    """A row per service bundle: `running` only when it stayed up with the same pid, unrestarted."""
    name = module_dir.name
    rows: list[tuple[str, ...]] = []
    for spec in load_module(module_dir).module.service_bundles():
        key = f"{name}/{spec.name}"
        if name in failures:
            rows.append((key, spec.language, "-", failures[name], "-", "-"))
            continue
        first = await _service_status(nc, node_name, key, deadline)
        if first is None or first["state"] != "running":
            state = "NOT RUNNING: " + (f"{first['state']} {first['last_error'] or ''}" if first else "not in status")
            rows.append((key, spec.language, "-", state.strip(), "-", "-"))
            continue
        await asyncio.sleep(SERVICE_STABLE_S)
        later = await _service_status(nc, node_name, key, deadline) or {}
        stable = later.get("state") == "running" and later.get("pid") == first["pid"] and later["restarts"] == 0
        state = "running" if stable else f"NOT STABLE: {later.get('state')} {later.get('last_exit') or ''}".strip()
        rows.append((key, spec.language, str(first["runs"]), state, str(first["pid"]), str(later.get("restarts"))))
    return rows


async def _service_status(nc: Client, node_name: str, key: str, deadline: float) -> dict[str, Any] | None:
    """The bundle's status once it is past starting/building (or the last seen at the deadline)."""
    last = None
    while time.monotonic() < deadline:
        try:
            status = json.loads((await nc.request(f"mesh.node.{node_name}.status", b"", timeout=5)).data)
        except Exception:  # the node is busy placing modules: ask again
            await asyncio.sleep(0.2)
            continue
        last = next((b for b in status["bundles"] if f"{b['module']}/{b['bundle']}" == key), None)
        if last is not None and last["state"] not in ("starting", "building"):
            return last
        await asyncio.sleep(0.2)
    return last
