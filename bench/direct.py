"""Spawn and initialize children directly: the baseline of the node's cold start and restart.

`python bench/direct.py SPECS.json all` starts every child of SPECS.json at once (the node
starts its bundles at once too), sends each `initialize`, `notifications/initialized` and
`tools/list`, and prints one JSON line: when every child had listed its tools (CLOCK_MONOTONIC
in ns, comparable with the caller's), then ends them. `solo N` starts each child alone, N times,
and prints each one's start-up: spawn to `initialize` answered, in ms.

Standard library only, so that its own start costs what a small Python program's start costs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import warnings

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench-direct", "version": "1"}}


def _line(rid: int, method: str, params: dict | None = None) -> bytes:
    msg: dict = {"jsonrpc": "2.0", "method": method}
    if rid:
        msg["id"] = rid
    if params is not None:
        msg["params"] = params
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


async def _answer(proc: asyncio.subprocess.Process, rid: int) -> dict:
    assert proc.stdout is not None
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {proc.pid} closed stdout before answering request {rid}")
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("id") == rid and "method" not in msg:
            if "error" in msg:
                raise RuntimeError(f"child {proc.pid}: {msg['error']}")
            return msg["result"]


async def _spawn(spec: dict) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *spec["argv"], cwd=spec["cwd"], env=spec["env"],
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True, limit=64 * 1024 * 1024,
    )


async def _start(spec: dict, list_tools: bool) -> tuple[asyncio.subprocess.Process, int]:
    """Spawn, initialize (and list); returns the process and when initialize was answered."""
    proc = await _spawn(spec)
    assert proc.stdin is not None
    proc.stdin.write(_line(1, "initialize", INIT))
    await _answer(proc, 1)
    initialized = time.monotonic_ns()
    proc.stdin.write(_line(0, "notifications/initialized"))
    if list_tools:
        proc.stdin.write(_line(2, "tools/list", {}))
        await _answer(proc, 2)
    return proc, initialized


async def _end(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.stdin is not None:
            p.stdin.close()  # closing stdin means "exit now"
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 5)
        except asyncio.TimeoutError:
            p.kill()
            await p.wait()


async def all_at_once(specs: list[dict]) -> dict:
    started = time.monotonic_ns()
    results = await asyncio.gather(*(_start(s, True) for s in specs), return_exceptions=True)
    ready = time.monotonic_ns()
    procs = [r[0] for r in results if not isinstance(r, BaseException)]
    errors = [f"{s.get('module', '?')}: {r}" for s, r in zip(specs, results) if isinstance(r, BaseException)]
    await _end(procs)
    return {"started_ns": started, "ready_ns": ready, "children": len(procs), "errors": errors}


async def solo(specs: list[dict], repeat: int) -> dict:
    out: dict[str, list[float]] = {}
    for spec in specs:
        times = out.setdefault(spec.get("module", spec["argv"][0]), [])
        for _ in range(repeat):
            t = time.monotonic_ns()
            proc, initialized = await _start(spec, False)
            times.append((initialized - t) / 1e6)
            await _end([proc])
    return {"startup_ms": out}


def _pidfd_watcher() -> None:
    # As the node does (launcher.process.use_pidfd_child_watcher): a pidfd per child instead of
    # a waiting thread per child. Written out here, not imported: the baseline's clock starts at
    # this script's exec, and importing the launcher would add the node's imports to it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(asyncio, "PidfdChildWatcher"):
            try:
                watcher = asyncio.PidfdChildWatcher()
                asyncio.set_child_watcher(watcher)
                watcher.attach_loop(asyncio.get_running_loop())
            except (OSError, NotImplementedError):
                pass


async def main(argv: list[str]) -> None:
    _pidfd_watcher()
    with open(argv[1]) as f:
        specs = json.load(f)
    result = await (all_at_once(specs) if argv[2] == "all" else solo(specs, int(argv[3])))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv))
