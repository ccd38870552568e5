"""A/B of the node's hot path: this checkout's node against a patched copy, in one run.

`python -m bench.compare DIR [--rounds N] [--seq N] [--conc N]` starts one nats-server and two
nodes, this checkout's (A) and the one in DIR (B: a copy of the checkout with a change to
runtime/ or launcher/), each serving the raw echo child under its own module name, and measures
both the way the benchmark measures the node, alternating A and B in every round. It prints the
medians and B/A: how much a change to the node buys before it lands.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
from pathlib import Path

from .modules import BENCH, echo_module
from .nodes import connect, start_nats, start_node, wait_settled
from .paths import CallPath
from .paths import client_path, measure, nats_path


async def run(args: argparse.Namespace) -> None:
    work = BENCH / ".work" / "compare"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    nats_proc, url = start_nats(work)
    nodes = []
    try:
        nc = await connect(url)
        paths = []
        for label, source in (("A", None), ("B", args.source)):
            manifests = work / f"modules-{label}"
            echo_module(manifests, f"echo-{label.lower()}")
            if source:
                os.environ["BENCH_NODE_SOURCE"] = str(Path(source).resolve())
            node = start_node(work, manifests, url, f"node-{label.lower()}")
            os.environ.pop("BENCH_NODE_SOURCE", None)
            nodes.append(node)
            await wait_settled(nc, node, f"node-{label.lower()}", 1, 120, print)
            paths.append(CallPath(label, "node", f"node {label}", nats_path(nc, f"mesh.tool.echo-{label.lower()}.echo",
                                   b'{"text":"hello"}'), {"node": node.pid}))
            if label == "A" and args.client:
                # C: node A again, every call through runtime/client.py (with the protocol's headers).
                paths.append(CallPath("C", "node", "node A via the client", client_path(
                    nc, "mesh.tool.echo-a.echo", {"text": "hello"}), {"node": node.pid}))
        results: dict[str, list[dict]] = {p.name: [] for p in paths}
        for r in range(args.rounds):
            for p in (paths if r % 2 == 0 else paths[::-1]):
                m = (await measure(p, args.seq, args.conc)).summary()
                results[p.name].append(m)
                print(f"round {r + 1} {p.name}: p50 {m['p50_us']:.0f} us, p99 {m['p99_us']:.0f} us, "
                      f"{m['calls_per_s']:.0f} calls/s, node CPU {m['cpu_us_per_call_seq']['node']:.0f} / "
                      f"{m['cpu_us_per_call_conc']['node']:.0f} us/call (sequential / 32 in flight)", flush=True)
        print()
        extra = f" {'C (A, client)':>18} {'C/A':>7}" if args.client else ""
        print(f"{'':<28} {'A (this checkout)':>18} {'B (' + str(args.source) + ')':>18} {'B/A':>7}{extra}")
        for key, label in (("p50_us", "p50 us"), ("p99_us", "p99 us"), ("calls_per_s", "calls/s at 32"),
                           ("cpu_seq", "node CPU us/call, sequential"), ("cpu_conc", "node CPU us/call, 32")):
            def pick(m: dict) -> float:
                if key == "cpu_seq":
                    return m["cpu_us_per_call_seq"]["node"]
                if key == "cpu_conc":
                    return m["cpu_us_per_call_conc"]["node"]
                return m[key]
            a = statistics.median(pick(m) for m in results["A"])
            b = statistics.median(pick(m) for m in results["B"])
            more = ""
            if args.client:
                c = statistics.median(pick(m) for m in results["C"])
                more = f" {c:18.0f} {c / a:7.2f}"
            print(f"{label:<28} {a:18.0f} {b:18.0f} {b / a:7.2f}{more}")
        await nc.close()
    finally:
        for node in nodes:
            node.stop()
        nats_proc.stop()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a copy of this checkout with a change to the node")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seq", type=int, default=2000, help="sequential calls per measurement")
    p.add_argument("--conc", type=int, default=10000, help="calls at 32 in flight per measurement")
    p.add_argument("--client", action="store_true",
                   help="also measure node A through runtime/client.py (the call protocol's headers on every call)")
    asyncio.run(run(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
