"""1,000 remembers and 1,000 recalls in a row through the memory module's stdio child: p50.

`.venv/bin/python -m bench.memory_calls [--count N]`. The child runs as the node runs it
(from source, MESH_* set, a fresh data folder under a temporary directory); each call is one
JSON-RPC line written and its answer read, with a caller in _meta as the node sets it, so the
figure is the module's own cost plus the SDK and the pipe, without the bus. Prints figures,
asserts nothing (speed goals are read, not tested). About 10 s.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    count = parser.parse_args().count
    with tempfile.TemporaryDirectory() as tmp:
        child = Child(Path(tmp) / "data")
        child.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "bench-memory", "version": "1"}})
        remember, recall_words, recall_key = [], [], []
        for i in range(count):
            args = {"content": f"Entry {i}: the {WORDS[i % 10]} rule number {i} for {WORDS[(i * 7) % 10]}.",
                    "type": ("decision", "convention", "constraint", "status")[i % 4]}
            if i % 2:
                args["key"] = f"bench.{WORDS[i % 10]}-{i % 100}"  # every other one upserts after the first 100
            if i % 5 == 0:
                args["scope"] = "private"
            remember.append(child.timed_call("remember", args, CALLERS[i % 2]))
        for i in range(count):
            who = CALLERS[i % 2]
            if i % 2:
                recall_key.append(child.timed_call("recall", {"key": f"bench.{WORDS[i % 10]}-{i % 100}"}, who))
            else:
                recall_words.append(child.timed_call("recall", {"query": f"{WORDS[i % 10]} rule", "limit": 20}, who))
        assert child.proc.stdin
        child.proc.stdin.close()
        child.proc.wait(10)
    print(f"memory module over stdio, {count} calls each, one caller in _meta per call (this machine, not asserted)")
    print(figures("remember", remember))
    print(figures("recall (all)", recall_words + recall_key))
    print(figures("recall by words", recall_words))
    print(figures("recall by key", recall_key))


if __name__ == "__main__":
    main()
