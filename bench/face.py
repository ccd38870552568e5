"""The MCP face (`meshctl mcp --http`) beside what a user would pick for the same job: one
Streamable HTTP endpoint in front of a stdio MCP server. FastMCP's proxy (PyPI `fastmcp`),
`mcp-proxy` (PyPI) and `supergateway` (npm), each in front of the same raw echo child
(bench/echo_child.py); the face in front of a node serving that child on a NATS bus. The same
client (the `mcp` SDK's Streamable HTTP client) calls `echo` on each, the paths interleaved
round by round; figures are medians over rounds.

    bash bench/run.sh --face            # installs the peers, then runs this
    .venv/bin/python -m bench.face [--rounds N] [--seq N] [--conc N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from .main import ENVS
from .modules import BENCH, ECHO_CHILD, echo_module
from .nodes import connect, meshctl, start_nats, start_node
from .paths import CallPath, http_path, measure
from .procs import Proc, free_port, wait_port

FASTMCP_PROXY = BENCH / "fastmcp_proxy.py"


def _peers(work: Path, procs: list[Proc]) -> tuple[dict[str, tuple[str, Proc]], list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found: dict[str, tuple[str, Proc]] = {}
    notes: list[str] = []
    commands = {
        "fastmcp proxy": (ENVS / "fastmcp" / "bin" / "python", lambda port: [
            str(ENVS / "fastmcp" / "bin" / "python"), str(FASTMCP_PROXY), str(port), sys.executable, str(ECHO_CHILD)]),
        "mcp-proxy": (ENVS / "mcp-proxy" / "bin" / "mcp-proxy", lambda port: [
            str(ENVS / "mcp-proxy" / "bin" / "mcp-proxy"), "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "WARNING", "--", sys.executable, str(ECHO_CHILD)]),
        "supergateway": (ENVS / "supergateway" / "node_modules" / ".bin" / "supergateway", lambda port: [
            str(ENVS / "supergateway" / "node_modules" / ".bin" / "supergateway"), "--stdio",
            f"{sys.executable} {ECHO_CHILD}", "--outputTransport", "streamableHttp", "--stateful",
            "--port", str(port), "--logLevel", "none"]),
    }
    for name, (binary, argv) in commands.items():
        if not binary.exists():
            notes.append(f"{name}: not installed at {binary} (bench/run.sh --face installs it); its row is left out")
            continue
        port = free_port()
        proc = Proc(name, argv(port), work / "logs" / f"{name.replace(' ', '-')}.log", env=env)
        procs.append(proc)
        try:
            wait_port(port, 60, proc.popen, name)
        except Exception as e:  # a peer that does not start is a row that says so, not a failed run
            notes.append(f"{name}: did not start ({e}); {proc.tail(3)}")
            continue
        found[name] = (f"http://127.0.0.1:{port}/mcp", proc)
    return found, notes


async def _face(work: Path, procs: list[Proc]) -> tuple[str, Proc, Proc]:
    nats_proc, url = start_nats(work)
    procs.append(nats_proc)
    manifests = work / "modules"
    echo_module(manifests, "echo")
    node = start_node(work, manifests, url, "bench-face")
    procs.append(node)
    nc = await connect(url)
    try:
        for _ in range(300):  # the echo bundle's subject answers: the node is ready
            try:
                await nc.request("mesh.tool.echo.echo", b'{"text":"hi"}', timeout=0.5)
                break
            except Exception:
                await asyncio.sleep(0.1)
    finally:
        await nc.close()
    port = free_port()
    face = Proc("meshctl mcp", [*meshctl(), "mcp", "--nats", url, "--http", f"127.0.0.1:{port}"],
                work / "logs" / "face.log")
    procs.append(face)
    wait_port(port, 30, face.popen, "meshctl mcp")
    return f"http://127.0.0.1:{port}/mcp", face, node


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = BENCH / ".work-face"
    procs: list[Proc] = []
    try:
        endpoint, face, node = await _face(work, procs)
        peers, notes = _peers(work, procs)
        paths = [CallPath("meshctl mcp", "face", "the face -> NATS -> node -> echo child",
                          http_path(endpoint, "echo_echo", {"text": "hello"}), {"face": face.pid, "node": node.pid})]
        for name, (url, proc) in peers.items():
            paths.append(CallPath(name, "peer", f"{name} -> echo child", http_path(url, "echo", {"text": "hello"}, proc.pid),
                                  {name: proc.pid}))
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.rounds):
            row = {}
            for path in paths:
                row[path.name] = (await measure(path, args.seq, args.conc, args.concurrency)).summary()
                print(f"round {r + 1} {path.name}: p50 {row[path.name]['p50_us']:.0f} us, "
                      f"{row[path.name]['calls_per_s']:.0f} calls/s", flush=True)
            rounds.append(row)
        names = [p.name for p in paths]
        summary = {
            n: {k: statistics.median(r[n][k] for r in rounds) for k in ("p50_us", "p99_us", "calls_per_s")}
            for n in names
        }
        return {"rounds": rounds, "summary": summary, "notes": notes,
                "settings": {"rounds": args.rounds, "seq_calls": args.seq, "conc_calls": args.conc,
                             "concurrency": args.concurrency}}
    finally:
        for proc in reversed(procs):
            proc.stop()


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    peers = [n for n in s if n != "meshctl mcp"]
    lines = ["| path | p50 (us) | p99 (us) | calls/s |", "|---|---|---|---|"]
    for name, row in s.items():
        lines.append(f"| {name} | {row['p50_us']:.0f} | {row['p99_us']:.0f} | {row['calls_per_s']:.0f} |")
    if peers:
        best_rate = max(s[n]["calls_per_s"] for n in peers)
        best_p50 = min(s[n]["p50_us"] for n in peers)
        face = s["meshctl mcp"]
        lines += ["", f"calls/s against the best peer: {face['calls_per_s'] / best_rate:.2f}x (goal 5x); "
                      f"p50 against the best peer: {face['p50_us'] / best_p50:.2f} (goal at most 0.33)"]
    return "\n".join(lines + [f"- {n}" for n in results["notes"]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.face", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq", type=int, default=300, help="sequential calls per path per round (p50, p99)")
    p.add_argument("--conc", type=int, default=1500, help="concurrent calls per path per round (calls/s)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", default=str(BENCH / "face-results.json"))
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
