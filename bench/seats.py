"""Replicated seats (issue 22): takeover time, RPO with writes in flight, and what one replicated
seat costs its holder, in one run. Prints figures; asserts nothing.

`.venv/bin/python -m bench.seats [--seconds N] [--ttl S]`. A nats-server with JetStream and two
real nodes serving bundles/memory from source; n1 holds the seat, its Litestream replicating
memory.sqlite3 every [seats] sync_interval_ms (1000).
- cost: the holder node's RSS and CPU (node, its memory child and its Litestream, each) over N
  seconds idle, then under 100 writes/s (memory.remember, one caller, paced);
- RPO and takeover: a writer keeps writing (about 50/s), n1 is killed with SIGKILL mid-stream;
  takeover is the kill to n2's first answered recall; the RPO is the age at the kill of the
  oldest answered write that n2 does not have (0 when none is lost), beside the sync interval.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.mesh import FAST_CONFIG, NatsServer, NodeProcess, call, client, wait_state  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> dict[int, str]:
    """The process and its descendants: pid -> a short name."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        words = [w.decode(errors="replace") for w in cmd if w]
        names[int(entry.name)] = _short(words)
    found = {pid: names.get(pid, "node")}
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in found and child not in found:
                found[child] = names.get(child, "?")
                grew = True
    return found


def _short(words: list[str]) -> str:
    text = " ".join(words)
    if "litestream" in text:
        return "litestream"
    if "main.py" in text:
        return "memory child"
    if "meshctl" in text or "runtime" in text:
        return "node"
    return Path(words[0]).name if words else "?"


def sample(pid: int) -> dict[str, tuple[float, float]]:
    """name -> (RSS MB, CPU seconds so far) for the node's tree (setpriv wrappers exec in place)."""
    out: dict[str, tuple[float, float]] = {}
    for p, name in tree(pid).items():
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            rss = int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE / 1e6
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        rss_before, cpu_before = out.get(name, (0.0, 0.0))
        out[name] = (rss_before + rss, cpu_before + cpu)
    return out


async def remember(nc, text: str, timeout: float = 5) -> int | None:  # type: ignore[no-untyped-def]
    try:
        code, body = await call(nc, "mesh.seat.memory.remember", {"content": text, "type": "status"}, timeout=timeout)
    except Exception:
        return None
    if code != 200 or body.get("isError"):
        return None
    return int(body["structuredContent"]["id"])


async def recall_ids(nc) -> set[int] | None:  # type: ignore[no-untyped-def]
    try:
        code, body = await call(nc, "mesh.seat.memory.recall", {"limit": 200}, timeout=2)
    except Exception:
        return None
    if code != 200 or body.get("isError"):
        return None
    return {e["id"] for e in body["structuredContent"]["entries"]}


async def paced(nc, rate: float, seconds: float, log: list[tuple[float, int]]) -> None:  # type: ignore[no-untyped-def]
    """Writes at `rate` a second for `seconds` (each awaited: one caller), answered ones logged."""
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        n += 1
        got = await remember(nc, f"bench {n}")
        if got is not None:
            log.append((time.monotonic(), got))
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def cost(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], seconds: float) -> str:
    parts = []
    for name in sorted(after):
        rss, cpu = after[name]
        cpu0 = before.get(name, (0.0, cpu))[1]
        parts.append(f"{name}: {rss:.0f} MB RSS, {100 * (cpu - cpu0) / seconds:.1f} % CPU")
    return "; ".join(parts)


async def run(work: Path, seconds: float, ttl: float) -> None:
    server = NatsServer(work / "nats").start()
    mods = work / "mods"
    shutil.copytree(REPO / "bundles" / "memory", mods / "memory", ignore=shutil.ignore_patterns("__pycache__"))
    config = FAST_CONFIG.replace("init_timeout_s = 2", "init_timeout_s = 20") + f"[seats]\nlease_ttl_s = {ttl:g}\n"
    nodes = []
    try:
        nc = await client(server.url)
        n1 = NodeProcess(work, mods, server.url, "n1", config=config)
        nodes.append(n1)
        n1.wait_log("serving on", timeout=60)
        await wait_state(nc, "n1", "memory/tools", "ready", timeout=60)
        n2 = NodeProcess(work, mods, server.url, "n2", config=config)
        nodes.append(n2)
        n2.wait_log("serving on", timeout=60)
        await wait_state(nc, "n2", "memory/tools", "standby", timeout=60)
        await remember(nc, "warm")
        await asyncio.sleep(2)

        before = sample(n1.proc.pid)
        await asyncio.sleep(seconds)
        print(f"idle, {seconds:g} s, holder n1: {cost(before, sample(n1.proc.pid), seconds)}")
        print(f"idle, standby n2: {cost(sample(n2.proc.pid), sample(n2.proc.pid), 1)}")
        log: list[tuple[float, int]] = []
        before = sample(n1.proc.pid)
        t0 = time.monotonic()
        await paced(nc, 100, seconds, log)
        took = time.monotonic() - t0
        print(
            f"100 writes/s asked, {len(log) / took:.0f}/s answered over {took:.1f} s, holder n1: "
            f"{cost(before, sample(n1.proc.pid), took)}"
        )
        await asyncio.sleep(2)

        log = []
        writer = asyncio.create_task(paced(nc, 50, 3600, log))
        await asyncio.sleep(3)
        killed = time.monotonic()
        n1.kill()
        answered = list(log)
        first = None
        while time.monotonic() - killed < ttl + 30:
            ids = await recall_ids(nc)
            if ids is not None:
                first = time.monotonic()
                break
            await asyncio.sleep(0.02)
        writer.cancel()
        if first is None:
            print("takeover: n2 did not answer within lease_ttl_s + 30 s")
            return
        print(f"takeover: kill -9 to the first answered recall: {first - killed:.2f} s (lease_ttl_s {ttl:g})")
        have = set()
        for _ in range(50):
            got = await recall_ids(nc)
            if got is not None:
                have = got
                break
        # recall answers the newest 200: judge only the writes that fit in it.
        recent = [(t, i) for t, i in answered if i >= min(have, default=0)]
        lost = [(t, i) for t, i in recent if i not in have]
        oldest_lost = killed - min(t for t, _ in lost) if lost else 0.0
        print(
            f"RPO with writes in flight (~50/s): {len(lost)} of the last {len(recent)} answered writes lost; "
            f"the oldest was answered {oldest_lost:.2f} s before the kill (sync_interval_ms 1000)"
        )
    finally:
        for node in nodes:
            node.kill()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="of each cost measurement")
    parser.add_argument("--ttl", type=float, default=3.0, help="[seats] lease_ttl_s of both nodes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-seats-") as tmp:
        asyncio.run(run(Path(tmp), args.seconds, args.ttl))


if __name__ == "__main__":
    main()
