"""The handoff child's idle CPU, before and after issue 25, side by side in one run.

`.venv/bin/python -m bench.handoff_idle --before REV [--seconds N]`. REV is a commit whose
bundles/handoff is the one to compare with (60f2e14 is the last one before issue 25). Prints
CPU-seconds per second of each child and their ratio; asserts nothing.

Both children are built here (the old one from `git archive REV bundles/handoff sdk/go`, the new
one from this checkout) and run as the node runs them (stdio, MESH_* set). Two stores each:
- empty;
- the flood of issue 25: 70 open entries with a 1 MB `frage`, opened through the old child
  (which takes them); the new child gets a copy of that file, which it migrates at its start.
Then all four children sit idle at once and their CPU time (the schedstat of each thread, to the
nanosecond) is read over the same seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.sdk import build_context, facts_env  # noqa: E402
from tests.support.stdio_client import StdioClient  # noqa: E402
from toolchains.go import TOOLCHAIN  # noqa: E402

ALICE = {"mesh/caller": {"account": "ALICE", "user": "alice", "name": None, "via": "bus"}}


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of the process, in seconds, to the nanosecond: the first field of
    each /proc/<pid>/task/<tid>/schedstat (utime + stime count whole 10 ms clock ticks, too coarse
    for an idle child). A thread that ended is not counted; Go's threads live as long as it does."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def build(module_dir: Path, base: Path) -> Path:
    TOOLCHAIN.build(build_context(module_dir, base / "stage", base / "cache", repo_root=module_dir.parents[1]))
    return base / "stage" / "bin" / "handoff"


def old_source(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", rev, "bundles/handoff", "sdk/go"], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "bundles" / "handoff"


def child(binary: Path, data: Path) -> StdioClient:
    c = StdioClient([str(binary)], cwd=binary.parent, env=facts_env("handoff", binary.parent.parent, data))
    c.initialize()
    return c


def flood(c: StdioClient) -> float:
    started = time.monotonic()
    for _ in range(70):
        r = c.call("handoff.open", {"projekt": "flood", "frage": "x" * 1_000_000, "versucht": "v", "benoetigt": "b"}, meta=ALICE)
        assert not r.get("isError"), r["content"]
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="the commit to compare with, e.g. 60f2e14")
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="handoff-idle-"))
    children: dict[str, Any] = {}
    try:
        before = build(old_source(args.before, work / "old"), work / "build-old")
        after = build(REPO / "bundles" / "handoff", work / "build-new")
        children["before, empty"] = child(before, work / "d-old-empty")
        children["after, empty"] = child(after, work / "d-new-empty")
        flooder = child(before, work / "d-old-flood")
        took = flood(flooder)
        print(f"the flood through the old child: 70 opens of 1 MB in {took:.1f} s")
        children["before, flood"] = flooder
        (work / "d-new-flood").mkdir()
        flooder.call("handoff.list", {"state": "open", "projekt": "nothing"})  # every write is on disk (WAL)
        for name in ("handoff.db", "handoff.db-wal"):
            if (work / "d-old-flood" / name).exists():
                shutil.copy(work / "d-old-flood" / name, work / "d-new-flood" / name)
        started = time.monotonic()
        children["after, flood"] = child(after, work / "d-new-flood")
        listed = children["after, flood"].call("handoff.list", {"limit": 100})
        assert not listed.get("isError"), listed
        print(f"the new child migrated the flooded store and listed it in {time.monotonic() - started:.1f} s")
        time.sleep(2)  # past the start
        first = {name: cpu_seconds(c.proc.pid) for name, c in children.items()}
        time.sleep(args.seconds)
        used = {name: (cpu_seconds(c.proc.pid) - first[name]) / args.seconds for name, c in children.items()}
        print(f"idle CPU over the same {args.seconds:g} s, CPU-seconds per second (load {os.getloadavg()[0]:.2f}):")
        for name, rate in used.items():
            print(f"  {name:15} {rate:.6f}")
        for store in ("empty", "flood"):
            old, new = used[f"before, {store}"], used[f"after, {store}"]
            print(f"  {store}: {old / new:.1f}x less" if new > 0 else f"  {store}: {old:.6f} -> 0")
        print(json.dumps({k: round(v, 7) for k, v in used.items()}))
    finally:
        for c in children.values():
            c.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
