"""Where the node spends its CPU per call: the node under cProfile, driven like the benchmark does.

`python -m bench.profile [--calls N] [--concurrency C] [--top K]` starts a nats-server and
`meshctl node run` under cProfile serving the raw echo child, makes N calls (C in flight), stops
the node gracefully and prints the functions with the most own time and the most cumulative time.
The profile file stays in bench/.work/profile/node.prof (open it with snakeviz or pstats).
cProfile slows Python code down several times; read the shares, not the absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import pstats
import shutil
import sys
import time

from .modules import BENCH, echo_module
from .nodes import ROOT, connect, start_nats, wait_settled
from .paths import _concurrent, nats_path
from .procs import Proc, cpu_ns


async def drive(args: argparse.Namespace) -> None:
    work = BENCH / ".work" / "profile"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    nats_proc, url = start_nats(work)
    node = None
    try:
        manifests = work / "modules"
        echo_module(manifests, "echo")
        prof = work / "node.prof"
        argv = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "runtime.meshctl", "node", "run",
                "--manifests", str(manifests), "--nats", url, "--name", "prof", "--state-dir", str(work / "state")]
        node = Proc("node", argv, work / "node.log", cwd=ROOT)
        nc = await connect(url)
        await wait_settled(nc, node, "prof", 1, 60, print)
        async with nats_path(nc, "mesh.tool.echo.echo", b'{"text":"hello"}')() as call:
            before = cpu_ns(node.pid)
            t = time.perf_counter()
            if args.concurrency <= 1:
                for _ in range(args.calls):
                    await call()
            else:
                await _concurrent(call, args.calls, args.concurrency)
            elapsed = time.perf_counter() - t
            used = cpu_ns(node.pid) - before
        print(f"{args.calls} calls, {args.concurrency} in flight: {args.calls / elapsed:.0f} calls/s under cProfile, "
              f"node CPU {used / 1000 / args.calls:.0f} us/call (inflated by the profiler)")
        await nc.close()
        node.stop(grace=30)  # SIGTERM: the node stops gracefully and cProfile writes its file
        node = None
        out = io.StringIO()
        stats = pstats.Stats(str(prof), stream=out)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
        print(f"profile: {prof}")
    finally:
        if node is not None:
            node.stop()
        nats_proc.stop()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--top", type=int, default=35)
    asyncio.run(drive(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
