"""The console's page times (issue 26: under 200 ms with 1,000 memory entries and 500 handoff entries).

A real node on its embedded bus serving the memory and handoff bundles; 1,000 memory entries
remembered in `global` and 500 handoff entries opened (100 of them escalated, 100 claimed) by the
operator's own caller; then `meshctl console` on its defaults (the console user, local login) and,
for each page, `--rounds` GETs one after another by one logged-in client. Printed per page: the
median and p90 of the whole page (HTTP round trip on loopback), and beside it the median of the bus
calls the page makes, asked straight (the same client library, as the console's person): what the
page adds over what it must ask.

    .venv/bin/python -m bench.console_pages [--rounds 40] [--memory 1000] [--handoff 500] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import nats

ROOT = Path(__file__).resolve().parents[1]
MESHCTL = [sys.executable, "-m", "runtime.meshctl"]
CONFIG = """
[health]
init_timeout_s = 60
"""
TYPES = ("decision", "convention", "constraint", "open_question", "glossary", "status")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_text(path: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if m := re.search(pattern, text, re.M):
            return m
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.1)
    raise SystemExit(f"{pattern!r} not seen in {path} within {timeout} s")


async def ask(nc: Any, verb: str, args: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    msg = await nc.request(f"mesh.seat.{verb}", json.dumps(args).encode(), timeout=30, headers=headers)
    body = json.loads(msg.data)
    if body.get("isError") or "structuredContent" not in body:
        raise SystemExit(f"{verb} {args}: {body}")
    result: dict[str, Any] = body["structuredContent"]
    return result


async def fill(url: str, local_pw: str, memory: int, handoff: int) -> list[str]:
    nc = await nats.connect(url, user="mesh-local", password=local_pw)
    try:
        sem = asyncio.Semaphore(16)

        async def one(coro: Any) -> Any:
            async with sem:
                return await coro

        await asyncio.gather(
            *[
                one(ask(nc, "memory.remember", {"content": f"Statement {i}: the rule about part {i % 97} holds.", "type": TYPES[i % 6], "scope": "global"}))
                for i in range(memory)
            ]
        )
        opened = await asyncio.gather(
            *[
                one(ask(nc, "handoff.open", {"projekt": f"p{i % 7}", "frage": f"Question {i} about part {i % 97}?", "versucht": "the docs", "benoetigt": "an answer"}))
                for i in range(handoff)
            ]
        )
        await asyncio.gather(*[one(ask(nc, "handoff.escalate", {"id": e["id"], "thema": "geld"})) for e in opened[:100]])
    finally:
        await nc.close()
    return [e["id"] for e in opened]


async def claim(url: str, console_pw: str, ids: list[str], person: str) -> None:
    nc = await nats.connect(url, user="mesh-console", password=console_pw)
    try:
        await asyncio.gather(*[ask(nc, "handoff.claim", {"id": i}, {"Mesh-Person": person}) for i in ids])
    finally:
        await nc.close()


async def direct_calls(url: str, console_pw: str, person: str, rounds: int) -> dict[str, list[float]]:
    """The bus calls each page makes, asked straight, one round after another (a page's calls in parallel, as it does)."""
    nc = await nats.connect(url, user="mesh-console", password=console_pw)
    h = {"Mesh-Person": person}
    calls = {
        "/memory": [("memory.scopes", {"include_private": False, "limit": 200}), ("memory.recall", {"scope": "global", "limit": 50})],
        "/handoff": [("handoff.list", {"state": s, "limit": 50}) for s in ("open", "claimed", "escalated", "resolved", "blocked")]
        + [("handoff.holders", {"limit": 100})],
        "/attention": [("handoff.attention", {"limit": 50})],
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    try:
        for _ in range(rounds):
            for page, asks in calls.items():
                t0 = time.perf_counter()
                if page == "/memory":  # the console asks the scopes first, then recalls
                    for verb, args in asks:
                        await ask(nc, verb, args, h)
                else:
                    await asyncio.gather(*[ask(nc, verb, args, h) for verb, args in asks])
                times[page].append(time.perf_counter() - t0)
    finally:
        await nc.close()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--memory", type=int, default=1000)
    p.add_argument("--handoff", type=int, default=500)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-console-"))
    mods = base / "mods"
    for module in ("memory", "handoff"):
        shutil.copytree(ROOT / "bundles" / module, mods / module, ignore=shutil.ignore_patterns("__pycache__"))
    state = base / "state"
    (base / "node.toml").write_text(CONFIG)
    env = dict(os.environ, MESH_STATE_DIR=str(state))
    node_log, console_log = base / "node.log", base / "console.log"
    node = subprocess.Popen(
        [*MESHCTL, "node", "run", "--manifests", str(mods), "--name", "bench", "--state-dir", str(state), "--config", str(base / "node.toml"), "--embedded-port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(node_log, "wb"),
    )
    console: subprocess.Popen[bytes] | None = None
    try:
        wait_for_text(node_log, r"bundle handoff/tools ready", node, 600)
        wait_for_text(node_log, r"bundle memory/tools ready", node, 600)
        info = json.loads((state / "bus.json").read_text())
        local_pw = (state / "bus-local.password").read_text().strip()
        console_pw = (state / "bus-console.password").read_text().strip()
        from runtime.wire.identity import encode_person, os_person

        person = encode_person(os_person())
        t0 = time.monotonic()
        ids = asyncio.run(fill(info["url"], local_pw, args.memory, args.handoff))
        # Claims come from another caller than the opener: the console's person claims 100 of the open ones.
        asyncio.run(claim(info["url"], console_pw, ids[100:200], person))
        print(f"filled {args.memory} memory entries and {args.handoff} handoff entries in {time.monotonic() - t0:.1f} s")
        port = free_port()
        console = subprocess.Popen(
            [*MESHCTL, "console", "--http", f"127.0.0.1:{port}", "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(console_log, "wb"),
        )
        login = wait_for_text(console_log, r"log in: (\S+)\)", console, 60).group(1)
        pages = ["/", "/memory", "/memory?scope=global&q=rule+part", "/handoff", "/attention", "/handoff/entry?id=h-1"]
        figures: dict[str, dict[str, float]] = {}
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            r = http.get(login)
            assert r.status_code in (200, 303), r.status_code
            for path in pages:  # one warm-up each (templates compiled, connections made)
                r = http.get(path)
                assert r.status_code == 200 and "<main>" in r.text, (path, r.status_code, r.text[:300])
            for path in pages:
                times, sizes = [], []
                for _ in range(args.rounds):
                    t = time.perf_counter()
                    r = http.get(path)
                    times.append(time.perf_counter() - t)
                    sizes.append(len(r.content))
                times.sort()
                figures[path] = {
                    "median_ms": statistics.median(times) * 1000,
                    "p90_ms": times[int(len(times) * 0.9) - 1] * 1000,
                    "bytes": statistics.median(sizes),
                }
        direct = asyncio.run(direct_calls(info["url"], console_pw, person, args.rounds))
        print(f"\n{'page':<34} {'median':>9} {'p90':>9} {'bytes':>8}   its bus calls asked straight (median)")
        for path, f in figures.items():
            straight = direct.get(path.split("?")[0]) if path in direct else None
            extra = f"   {statistics.median(straight) * 1000:6.1f} ms ({f['median_ms'] / (statistics.median(straight) * 1000):.1f}x)" if straight else ""
            if straight:
                f["bus_median_ms"] = statistics.median(straight) * 1000
            print(f"{path:<34} {f['median_ms']:7.1f} ms {f['p90_ms']:7.1f} ms {f['bytes']:8.0f}{extra}")
        slowest = max(f["median_ms"] for f in figures.values())
        print(f"\nslowest page median: {slowest:.1f} ms (goal: under 200 ms) with {args.memory} memory and {args.handoff} handoff entries")
        if args.json:
            Path(args.json).write_text(json.dumps({"memory": args.memory, "handoff": args.handoff, "rounds": args.rounds, "pages": figures}, indent=2))
    finally:
        for proc in (console, node):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
