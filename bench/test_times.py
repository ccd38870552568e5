"""Did a test get slower? Each test's time in this checkout beside its time at another commit.

`python -m bench.test_times --before REF [--rounds N] TEST_FILE ...` checks REF out into
bench/.work/test-times/<ref> (a detached git worktree), then runs the given test files there and
here in turn, A B A B ..., after one warm-up run of each that is not counted (it fills the compiler
caches both use). Each run writes a JUnit XML report; a test's time is its median over the rounds.
Both runs use this checkout's virtualenv; PYTHONPATH puts each tree's own code first.

It prints every test found in both, slowest ratio first, and the tests slower by more than
--slack (default 20 %) and more than --floor seconds (default 0.5): on a shared machine a test
of a few tenths of a second swings by more than that. It asserts nothing; the figures are for
docs/performance.md and the closing note.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "test-times"


def _tree(ref: str) -> Path:
    """A worktree of `ref`, made once."""
    folder = WORK / ref
    if not (folder / "pyproject.toml").is_file():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), ref], check=True)
    return folder


def _run(tree: Path, files: list[str], report: Path) -> dict[str, float]:
    """Run `files` in `tree`; each test's seconds by its id (file::name[params])."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *files]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f"  {tree.name if tree != ROOT else 'this checkout'}: {last[0]}", flush=True)
    times: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("skipped") is None:
            times[f"{case.get('classname', '')}::{case.get('name', '')}"] = float(case.get("time", "0"))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git ref to compare this checkout with")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slack", type=float, default=0.2, help="a test slower by more than this share is named")
    parser.add_argument("--floor", type=float, default=0.5, help="...and by more than this many seconds")
    parser.add_argument("files", nargs="+", help="test files, as pytest takes them (relative to the checkout)")
    args = parser.parse_args()
    before = _tree(args.before)
    WORK.mkdir(parents=True, exist_ok=True)
    now_times: dict[str, list[float]] = {}
    then_times: dict[str, list[float]] = {}
    for r in range(args.rounds + 1):
        print(f"round {r}{' (warm-up, not counted)' if r == 0 else ''}", flush=True)
        for tree, into in (
            ((ROOT, now_times), (before, then_times)) if r % 2 else ((before, then_times), (ROOT, now_times))
        ):
            got = _run(tree, args.files, WORK / f"report-{'now' if tree == ROOT else 'before'}.xml")
            if r > 0:
                for test, seconds in got.items():
                    into.setdefault(test, []).append(seconds)
    both = sorted(set(now_times) & set(then_times))
    rows = []
    for test in both:
        now, then = statistics.median(now_times[test]), statistics.median(then_times[test])
        rows.append((now / then if then > 0 else 1.0, now, then, test))
    rows.sort(reverse=True)
    load = os.getloadavg()
    print(
        f"\n{len(both)} tests in both ({len(now_times)} now, {len(then_times)} at {args.before}); "
        f"{args.rounds} rounds, medians; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print(f"{'now/before':>10} {'now s':>8} {'before s':>8}  test")
    for ratio, now, then, test in rows:
        print(f"{ratio:9.2f}x {now:8.2f} {then:8.2f}  {test}")
    slower = [r for r in rows if r[0] > 1 + args.slack and r[1] - r[2] > args.floor]
    total_now, total_then = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(
        f"\ntotal of the tests in both: {total_now:.1f} s now, {total_then:.1f} s before ({total_now / total_then:.2f}x)"
    )
    print(f"slower by more than {args.slack:.0%} and {args.floor} s: {len(slower)}")
    for ratio, now, then, test in slower:
        print(f"  {test}: {then:.2f} -> {now:.2f} s ({ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
