"""Recall in the memory child with 2,000 entries: p50, p90, p99 of each kind of recall, and the store's
own share of it measured in-process in the same run.

`.venv/bin/python -m bench.memory_recall [--entries N] [--calls N]`. Prints figures and the load
average, asserts nothing (issue 25's goal, recall p50 under 5 ms in the child, is read, not tested).

- the child: as the node runs it (from source, MESH_* set, a fresh data folder), each call one
  JSON-RPC line written and its answer read, a caller in _meta as the node sets it (bench/memory_calls.py's
  Child): the module, the SDK and the pipe, without the bus. 2,000 entries remembered first (two
  members, every other keyed, every fifth private, ten topic words), then the kinds of recall in
  rounds, one call of each kind per round, so a busy moment of the machine costs every kind alike.
- in-process: the same calls on the store alone (memory/store.py in this process, its own copy of
  the data), timed between the same rounds: what the SDK and the pipe add is the difference.
- then a pass through all entries with a cursor (limit 50) while 200 more are written between pages,
  counting repeats and gaps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .memory_calls import CALLERS, SOURCE, WORDS, Child

sys.path.insert(0, str(SOURCE))

from memory.config import Config  # noqa: E402
from memory.identity import writer  # noqa: E402
from memory.store import Store  # noqa: E402
from mesh_sdk.call import parse_caller  # noqa: E402

TYPES = ("decision", "convention", "constraint", "status", "glossary", "open_question")


def entries(count: int) -> list[tuple[dict[str, Any], int]]:
    made = []
    for i in range(count):
        args: dict[str, Any] = {
            "content": f"Entry {i}: the {WORDS[i % 10]} rule number {i} for {WORDS[(i * 7) % 10]} and its owners.",
            "type": TYPES[i % 6],
        }
        if i % 2:
            args["key"] = f"bench.{WORDS[i % 10]}-{i}"
        if i % 5 == 0:
            args["scope"] = "private"
        made.append((args, i % 2))
    return made


def kinds(i: int, count: int, cursor: str | None) -> dict[str, tuple[str, dict[str, Any], int]]:
    """One call of each kind for round `i` of `count` entries: (verb, arguments, which caller)."""
    word = WORDS[i % 10]
    keyed = (2 * i + 1) % (count - count % 2)  # an odd index: a keyed entry
    calls = {
        "words (2)": ("recall", {"query": f"{word} rule"}, 0),
        "one word": ("recall", {"query": WORDS[(i * 3) % 10]}, 1),
        "prefix": ("recall", {"query": word[:3]}, 0),
        "stem": ("recall", {"query": f"{word}s owner"}, 1),
        "by key": ("recall", {"key": f"bench.{WORDS[keyed % 10]}-{keyed}"}, 1),
        "newest 20": ("recall", {}, 0),
        "type, limit 50": ("recall", {"type": TYPES[i % 6], "limit": 50}, 1),
        "private scope": ("recall", {"scope": "private"}, 0),
        "load_context": ("load_context", {}, 0),
    }
    if cursor is not None:
        calls["next page (cursor)"] = ("recall", {"cursor": cursor}, 0)
    return calls


def rotated(calls: dict[str, Any], i: int) -> list[tuple[str, Any]]:
    items = list(calls.items())
    start = i % len(items)
    return items[start:] + items[:start]


def figures(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    q = statistics.quantiles(ms, n=100)
    return f"{name:<20} p50={statistics.median(ms):7.3f} ms  p90={q[89]:7.3f} ms  p99={q[98]:7.3f} ms"


class InProcess:
    """The store alone, on its own copy of the same entries."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True)
        self.store = Store(data_dir, Config())
        self.writers = [writer(parse_caller(c)) for c in CALLERS]

    def call(self, verb: str, args: dict[str, Any], who: int) -> Any:
        if verb == "remember":
            return self.store.remember(
                self.writers[who], args["content"], args["type"], args.get("key"), args.get("scope")
            ).data
        if verb == "load_context":
            return self.store.load_context(self.writers[who], **args).data
        return self.store.recall(self.writers[who], **args).data

    def timed(self, verb: str, args: dict[str, Any], who: int) -> float:
        start = time.perf_counter()
        self.call(verb, args, who)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=500, help="rounds: calls of each kind")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        child = Child(Path(tmp) / "child")
        child.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "bench-memory-recall", "version": "1"}})
        local = InProcess(Path(tmp) / "local")
        for args, who in entries(opts.entries):
            child.timed_call("remember", args, CALLERS[who])
            local.call("remember", args, who)
        child_times: dict[str, list[float]] = {}
        local_times: dict[str, list[float]] = {}
        cursor_child = child.request("tools/call", {"name": "memory.recall", "arguments": {"limit": 20},
                                                    "_meta": {"mesh/caller": CALLERS[0]}})["structuredContent"]["next_cursor"]
        cursor_local = local.call("recall", {"limit": 20}, 0)["next_cursor"]
        for i in range(-20, opts.calls):  # 20 rounds of warm-up, not counted
            # Each round starts at another kind (the first call after the child slept pays its wake-up).
            for name, (verb, args, who) in rotated(kinds(i, opts.entries, cursor_child), i):
                took = child.timed_call(verb, args, CALLERS[who])
                if i >= 0:
                    child_times.setdefault(name, []).append(took)
            for name, (verb, args, who) in rotated(kinds(i, opts.entries, cursor_local), i):
                took = local.timed(verb, args, who)
                if i >= 0:
                    local_times.setdefault(name, []).append(took)

        # A pass with a cursor while 200 entries are written between pages.
        seen: list[int] = []
        page = local.call("recall", {"limit": 50}, 0)
        before = {e["id"] for e in local.store.recall(local.writers[0], limit=200).data["entries"]}
        listed = set(_all_ids(local))
        added = 0
        while True:
            seen += [e["id"] for e in page["entries"]]
            for _ in range(8):  # all 200 written before the last page (36 pages of 50 for 1,800 entries)
                if added < 200:
                    local.call("remember", {"content": f"Added while paging {added}.", "type": "status"}, 1)
                    added += 1
            if page["next_cursor"] is None:
                break
            page = local.call("recall", {"limit": 50, "cursor": page["next_cursor"]}, 0)
        assert child.proc.stdin
        child.proc.stdin.close()
        child.proc.wait(10)
        local.store.close()

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    every_child = [t for name, times in child_times.items() if name != "load_context" for t in times]
    every_local = [t for name, times in local_times.items() if name != "load_context" for t in times]
    print(f"memory recall with {opts.entries} entries, {opts.calls} calls of each kind; load average {load} "
          "(this machine, not asserted)")
    print(f"\nin the child (stdio round trip, caller in _meta): recall p50 {statistics.median(every_child) * 1000:.3f} ms "
          "over all kinds (goal: under 5 ms)")
    for name, times in child_times.items():
        print("  " + figures(name, times))
    print(f"\nthe store alone, in-process: recall p50 {statistics.median(every_local) * 1000:.3f} ms over all kinds")
    for name, times in local_times.items():
        print("  " + figures(name, times))
    print(f"\npaging with limit 50 while {added} entries were written between pages: {len(seen)} listed, "
          f"{len(seen) - len(set(seen))} repeated, {len(listed - set(seen))} skipped "
          f"(first page's newest 200 all there: {before <= set(seen)})")


def _all_ids(local: InProcess) -> list[int]:
    found, cursor = [], None
    while True:
        page = local.call("recall", {"limit": 200, **({"cursor": cursor} if cursor else {})}, 0)
        found += [e["id"] for e in page["entries"]]
        if (cursor := page["next_cursor"]) is None:
            return found


if __name__ == "__main__":
    main()
