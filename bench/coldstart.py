"""Cold start of 35 bundles, restart after SIGKILL, and the node's memory, against the children alone.

- Node: from the exec of `meshctl node run` to every one of its tools answering a call on the bus
  (status is polled every 10 ms; once every bundle is ready, one call per tool is made, and the
  time is taken when the last answer is in).
- Direct: from the exec of bench/direct.py to every child having answered `initialize` and
  `tools/list`, all children started at once (as the node starts them). The children are the
  very processes the node ran: argv, working folder and environment are read from /proc.
- Restart: SIGKILL to one child, then calls to its tool in a loop (1 ms apart) until one answers;
  against the child's own start-up, spawn to `initialize` answered, measured alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import nats
from nats.aio.client import Client

from .modules import Target
from .nodes import bundle_key, start_node, status
from .paths import ERROR_HEADER
from .procs import Proc, process_facts, rss_bytes  # noqa: F401  (Proc: the type returned)

DIRECT = Path(__file__).resolve().parent / "direct.py"


async def call_ok(nc: Client, target: Target, timeout: float = 30) -> tuple[bool, str]:
    """One call; answered by the child (200, or 400 when the child refused our arguments)."""
    try:
        msg = await nc.request(f"mesh.tool.{target.module}.{target.tool}", target.arguments, timeout=timeout)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as e:
        return False, type(e).__name__
    code = (msg.headers or {}).get(ERROR_HEADER)
    if code is None or code == "400":
        return True, code or "200"
    return False, f"{code} {msg.data[:200]!r}"


async def node_cold_start(nc: Client, workdir: Path, manifests: Path, url: str, name: str,
                          targets: list[Target], timeout: float,
                          progress: Callable[[str], None] | None = None) -> tuple[Proc, dict[str, Any]]:
    """Start a node on `manifests`; returns it (still running) and the figures of its start."""
    said = time.monotonic()
    started = time.monotonic_ns()
    node = start_node(workdir, manifests, url, name, fresh=False)
    ready_at: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while True:
        if not node.alive():
            raise RuntimeError(f"node {name} exited (code {node.popen.returncode}):\n{node.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"node {name}: not every bundle ready within {timeout:g} s; last status {last}")
        last = await status(nc, name, timeout=2)
        now = time.monotonic_ns()
        if last is not None:
            for b in last["bundles"]:
                if b["state"] == "ready":
                    ready_at.setdefault(b["module"], (now - started) / 1e9)
            failed = [f"{bundle_key(b)}: {b['last_error'] or b['last_exit']}" for b in last["bundles"] if b["state"] == "failed"]
            if failed:
                raise RuntimeError(f"node {name}: bundles failed at start: {'; '.join(failed)}")
            if len(ready_at) >= len(targets):
                break
            if progress is not None and time.monotonic() - said > 15:
                said = time.monotonic()
                states = [b["state"] for b in last["bundles"]]
                progress(f"  node {name}: {dict((s, states.count(s)) for s in sorted(set(states)))}")
        await asyncio.sleep(0.01)
    answers = await asyncio.gather(*(call_ok(nc, t) for t in targets))
    served = time.monotonic_ns()
    bad = [f"{t.module}: {why}" for t, (ok, why) in zip(targets, answers) if not ok]
    if bad:
        raise RuntimeError(f"node {name}: tools not served after start: {'; '.join(bad)}")
    return node, {
        "seconds": (served - started) / 1e9,
        "rss_mb": rss_bytes(node.pid) / 1e6,
        "bundles": len(last["bundles"]) if last else 0,
        "slowest": sorted(ready_at.items(), key=lambda kv: -kv[1])[:5],
    }


async def child_specs(nc: Client, name: str) -> list[dict[str, Any]]:
    """argv, cwd and environment of every child the node runs now: the direct baseline's children."""
    st = await status(nc, name)
    assert st is not None
    specs = []
    for b in st["bundles"]:
        if b["pid"]:
            argv, cwd, env = process_facts(b["pid"])
            specs.append({"module": b["module"], "argv": argv, "cwd": cwd, "env": env})
    return specs


def direct(specs_file: Path, mode: list[str], timeout: float) -> dict[str, Any]:
    """Run bench/direct.py; its figures and when it was exec'd (CLOCK_MONOTONIC ns)."""
    started = time.monotonic_ns()
    proc = subprocess.run([sys.executable, str(DIRECT), str(specs_file), *mode], capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/direct.py {' '.join(mode)} failed: {proc.stderr.strip()[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["exec_ns"] = started
    return result


def direct_all(specs_file: Path, timeout: float) -> dict[str, Any]:
    result = direct(specs_file, ["all"], timeout)
    if result["errors"]:
        raise RuntimeError(f"direct start: {'; '.join(result['errors'])}")
    return {"seconds": (result["ready_ns"] - result["exec_ns"]) / 1e9, "children": result["children"]}


def solo_startup_ms(specs: list[dict[str, Any]], specs_file: Path, repeat: int, timeout: float) -> dict[str, float]:
    specs_file.write_text(json.dumps(specs))
    result = direct(specs_file, ["solo", str(repeat)], timeout)
    return {module: statistics.median(times) for module, times in result["startup_ms"].items()}


async def restart_ms(nc: Client, name: str, target: Target, timeout: float = 30) -> float:
    """SIGKILL the child of `target`; ms until its tool answers again."""
    st = await status(nc, name)
    assert st is not None
    bundle = next(b for b in st["bundles"] if b["module"] == target.module)
    if bundle["state"] != "ready" or not bundle["pid"]:
        raise RuntimeError(f"{target.module} is {bundle['state']}, not ready: cannot time its restart")
    os.kill(bundle["pid"], signal.SIGKILL)
    killed = time.monotonic_ns()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok, _ = await call_ok(nc, target, timeout=5)
        if ok:
            answered = time.monotonic_ns()
            after = await status(nc, name)
            pid = next(b["pid"] for b in (after or {}).get("bundles", []) if b["module"] == target.module)
            if pid == bundle["pid"]:
                raise RuntimeError(f"{target.module}: answered by the killed child {pid}?")
            return (answered - killed) / 1e6
        await asyncio.sleep(0.001)
    raise RuntimeError(f"{target.module}: no answer within {timeout:g} s of its SIGKILL")
