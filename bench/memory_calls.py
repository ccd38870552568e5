"""1,000 remembers and 1,000 recalls in a row through the memory module: p50, p90, p99.

`.venv/bin/python -m bench.memory_calls [--count N] [--bus]`. Prints figures and the load
average, asserts nothing (speed goals are read, not tested).

- stdio (the default): the child runs as the node runs it (from source, MESH_* set, a fresh data
  folder under a temporary directory); each call is one JSON-RPC line written and its answer
  read, with a caller in _meta as the node sets it: the module's own cost plus the SDK and the
  pipe, without the bus. About 10 s.
- `--bus`: a real node (`meshctl node run`) on its embedded bus with two caller accounts
  (`[[nats.caller]]` alice and bob), each member on its own connection calling
  `mesh.seat.memory.<verb>` with runtime/client.py, one call at a time; the caller is the
  server's stamp. The same calls, plus the bus, the node's dispatch and the protocol. About 20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "bundles" / "memory" / "src"
CALLERS = [{"account": "ALICE", "user": "alice", "name": None, "via": "bus"},
           {"account": "BOB", "user": "bob", "name": None, "via": "bus"}]
WORDS = "ledger invoice refund cart release deploy postgres kafka retention audit".split()


class Child:
    def __init__(self, data_dir: Path) -> None:
        env = {"PATH": "/usr/bin:/bin", "MESH_NODE": "bench", "MESH_MODULE": "memory", "MESH_BUNDLE": "tools",
               "MESH_BUNDLE_DIR": str(SOURCE), "MESH_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO / "sdk" / "python")}
        self.proc = subprocess.Popen([sys.executable, "main.py"], cwd=SOURCE, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.next = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.next += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params}).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.next:
                return reply["result"]

    def timed_call(self, verb: str, arguments: dict[str, Any], who: dict[str, Any]) -> float:
        start = time.perf_counter()
        result = self.request("tools/call", {"name": f"memory.{verb}", "arguments": arguments,
                                             "_meta": {"mesh/caller": who}})
        elapsed = time.perf_counter() - start
        if result.get("isError"):
            raise SystemExit(f"memory.{verb} refused: {result['content'][0]['text']}")
        return elapsed


def figures(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    q = statistics.quantiles(ms, n=100)
    return f"{name:<20} n={len(ms):<5} p50={statistics.median(ms):.3f} ms  p90={q[89]:.3f} ms  p99={q[98]:.3f} ms"


Call = tuple[str, dict[str, Any], int]  # verb, arguments, which caller (0 alice, 1 bob)


def workload(count: int) -> tuple[list[Call], list[Call], list[Call]]:
    """remembers (every other one keyed, so they upsert after the first 100; every fifth private),
    then recalls by words and by key, alternating callers."""
    remember, recall_words, recall_key = [], [], []
    for i in range(count):
        args: dict[str, Any] = {"content": f"Entry {i}: the {WORDS[i % 10]} rule number {i} for {WORDS[(i * 7) % 10]}.",
                                "type": ("decision", "convention", "constraint", "status")[i % 4]}
        if i % 2:
            args["key"] = f"bench.{WORDS[i % 10]}-{i % 100}"
        if i % 5 == 0:
            args["scope"] = "private"
        remember.append(("remember", args, i % 2))
    for i in range(count):
        if i % 2:
            recall_key.append(("recall", {"key": f"bench.{WORDS[i % 10]}-{i % 100}"}, 1))
        else:
            recall_words.append(("recall", {"query": f"{WORDS[i % 10]} rule", "limit": 20}, 0))
    return remember, recall_words, recall_key


def run_stdio(count: int) -> list[list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        child = Child(Path(tmp) / "data")
        child.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "bench-memory", "version": "1"}})
        timed = [[child.timed_call(verb, args, CALLERS[who]) for verb, args, who in calls]
                 for calls in workload(count)]
        assert child.proc.stdin
        child.proc.stdin.close()
        child.proc.wait(10)
    return timed


MEMBERS = ("alice", "bob")  # caller accounts of the embedded bus, one user each; the index is the workload's `who`


def bus_config() -> str:
    """The node's config: the operator's local identity and a `[[nats.caller]]` account per member."""
    callers = "".join(f'\n[[nats.caller]]\naccount = "{m}"\nuser = "{m}"\npassword = "{m}-bench"\n' for m in MEMBERS)
    return f'[identity]\nlocal = "ops"\n{callers}'


async def wait_ready(url: str, password: str, node: str, timeout: float) -> None:
    from .nodes import connect, status

    nc = await connect(url.replace("nats://", f"nats://mesh-node:{password}@", 1))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = await status(nc, node, timeout=2) or {"bundles": []}
            if any(b["module"] == "memory" and b["state"] == "ready" for b in found["bundles"]):
                return
            await asyncio.sleep(0.1)
        raise SystemExit(f"memory did not become ready within {timeout:g} s")
    finally:
        await nc.close()


async def bus_calls(url: str, count: int) -> list[list[float]]:
    import nats

    from runtime.client import MeshClient, tool_result

    conns = [await nats.connect(url, user=m, password=f"{m}-bench", name=f"bench-{m}") for m in MEMBERS]
    members = [MeshClient(nc) for nc in conns]

    async def timed_call(verb: str, args: dict[str, Any], who: int) -> float:
        start = time.perf_counter()
        result = tool_result(await members[who].call(f"mesh.seat.memory.{verb}", args, timeout_s=20))
        elapsed = time.perf_counter() - start
        if result.get("isError"):
            raise SystemExit(f"memory.{verb} refused: {result['content'][0]['text']}")
        return elapsed

    try:
        return [[await timed_call(verb, args, who) for verb, args, who in calls] for calls in workload(count)]
    finally:
        for member, nc in zip(members, conns):
            await member.close()
            await nc.close()


def run_bus(count: int) -> list[list[float]]:
    from .nodes import meshctl
    from .procs import Proc

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "bundles" / "memory", work / "mods" / "memory",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (work / "node.toml").write_text(bus_config())
        state = work / "state"
        node = Proc("node", [*meshctl(), "node", "run", "--manifests", str(work / "mods"), "--name", "bench-memory",
                             "--state-dir", str(state), "--config", str(work / "node.toml"), "--embedded-port", "0"],
                    work / "node.log", cwd=REPO)
        try:
            deadline = time.monotonic() + 30
            while not (state / "bus.json").is_file() or not (state / "bus-mesh.password").is_file():
                if time.monotonic() > deadline or not node.alive():
                    raise SystemExit(f"the node did not start: {(work / 'node.log').read_text()[-2000:]}")
                time.sleep(0.05)
            url = json.loads((state / "bus.json").read_text())["url"]
            asyncio.run(wait_ready(url, (state / "bus-mesh.password").read_text().strip(), "bench-memory", 60))
            return asyncio.run(bus_calls(url, count))
        finally:
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--bus", action="store_true", help="through a node on its embedded bus, two caller accounts")
    opts = parser.parse_args()
    remember, recall_words, recall_key = (run_bus if opts.bus else run_stdio)(opts.count)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if opts.bus:
        print(f"memory seat over the bus (node, embedded nats-server, two caller accounts), {opts.count} calls each, "
              f"one at a time; load average {load} (this machine, not asserted)")
    else:
        print(f"memory module over stdio, {opts.count} calls each, one caller in _meta per call; "
              f"load average {load} (this machine, not asserted)")
    print(figures("remember", remember))
    print(figures("recall (all)", recall_words + recall_key))
    print(figures("recall by words", recall_words))
    print(figures("recall by key", recall_key))


if __name__ == "__main__":
    main()
