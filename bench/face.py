"""The MCP face (`meshctl mcp --http`) beside what a user would pick for the same job: one
Streamable HTTP endpoint in front of a stdio MCP server. FastMCP's proxy (PyPI `fastmcp`),
`mcp-proxy` (PyPI) and `supergateway` (npm), each in front of the same raw echo child
(bench/echo_child.py); the face in front of a node serving that child on a NATS bus. Two clients
call `echo` on each: the `mcp` SDK's Streamable HTTP client (what an agent runs) and a lean one
(bench/lean_http.py: about 20 us of CPU a call, so that a server's figures are its own), the
paths interleaved round by round, every path warmed up before its timed phases; figures are
medians over rounds, the targets' ratios medians of ratios taken within a round.
`--before REF` measures the face of a git ref (e.g. main) beside this checkout's, on the same bus.

    bash bench/run.sh --face            # installs the peers, then runs this
    .venv/bin/python -m bench.face [--rounds N] [--seq N] [--conc N] [--before REF]
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
from .lean_http import MODERN
from .nodes import ROOT, connect, meshctl, start_nats, start_node
from .paths import CallPath, client_path, http_path, lean_http_path, measure
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


def _before_source(work: Path, ref: str) -> Path:
    """A checkout of `ref` (git archive) whose face is measured beside this one's."""
    import subprocess

    target = work / f"before-{ref}"
    if not (target / "runtime").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def _start_face(work: Path, procs: list[Proc], url: str, name: str, source: Path | None, extra: list[str]) -> tuple[str, Proc]:
    port = free_port()
    argv = ([sys.executable, "-m", "runtime.meshctl"] if source is not None else meshctl())
    face = Proc(name, [*argv, "mcp", "--nats", url, "--http", f"127.0.0.1:{port}", *extra],
                work / "logs" / f"{name.replace(' ', '-').replace('@', '')}.log", cwd=source)
    procs.append(face)
    wait_port(port, 30, face.popen, name)
    return f"http://127.0.0.1:{port}/mcp", face


async def _mesh(work: Path, procs: list[Proc]) -> tuple[str, Proc, Proc]:
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
    return url, node, nats_proc


FACE = "meshctl mcp"
BUS_LEG = "bus leg alone"
SDK, LEAN = "mcp SDK client", "lean client"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = BENCH / ".work-face"
    procs: list[Proc] = []
    closers: list[Any] = []
    try:
        url, node, nats_proc = await _mesh(work, procs)
        faces = [(FACE, *_start_face(work, procs, url, FACE, None, args.face_args))]
        if args.before:
            name = f"{FACE} @{args.before}"
            faces.append((name, *_start_face(work, procs, url, name, _before_source(work, args.before), [])))
        peers, notes = _peers(work, procs)
        arguments = {"text": "hello"}
        paths: list[CallPath] = []
        for name, endpoint, proc in faces:
            watch = {"face": proc.pid, "node": node.pid, "nats": nats_proc.pid}
            paths.append(CallPath(name, "face", f"{SDK} -> the face -> NATS -> node -> echo child",
                                  http_path(endpoint, "echo_echo", arguments), watch))
            paths.append(CallPath(f"{name} [lean]", "face", f"{LEAN} -> the face -> NATS -> node -> echo child",
                                  lean_http_path(endpoint, "echo_echo", arguments), watch))
            if name == FACE:
                paths.append(CallPath(f"{name} [lean, 2026-07-28]", "face", f"{LEAN}, stateless revision -> the face",
                                      lean_http_path(endpoint, "echo_echo", arguments, MODERN), watch))
        # The face's bus leg alone, as the face calls it (Mesh-Progress asked): the floor under its figures.
        bus_nc = await connect(url)
        closers.append(bus_nc.close)
        paths.append(CallPath(BUS_LEG, "leg", "MeshClient (progress asked) -> NATS -> node -> echo child",
                              client_path(bus_nc, "mesh.tool.echo.echo", arguments, progress=True),
                              {"node": node.pid, "nats": nats_proc.pid}))
        for name, (endpoint, proc) in peers.items():
            paths.append(CallPath(name, "peer", f"{SDK} -> {name} -> echo child",
                                  http_path(endpoint, "echo", arguments, proc.pid), {"server": proc.pid}))
            paths.append(CallPath(f"{name} [lean]", "peer", f"{LEAN} -> {name} -> echo child",
                                  lean_http_path(endpoint, "echo", arguments, peer_pid=proc.pid), {"server": proc.pid}))
        # The paths a target compares are measured next to each other (the machine's load drifts within
        # minutes): one group per client, the face's bus leg with the lean group, the --before face last.
        groups = [
            [p for p in paths if p.name.endswith("[lean]") and not p.name.startswith(f"{FACE} @")]
            + [p for p in paths if p.name == BUS_LEG or p.name.endswith("2026-07-28]")],
            [p for p in paths if not p.name.endswith("]") and p.name != BUS_LEG and not p.name.startswith(f"{FACE} @")],
            [p for p in paths if p.name.startswith(f"{FACE} @")],
        ]
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.rounds):
            row = {}
            # Every round starts each group at another path: no path is always first.
            ordered = [path for g in groups if g for path in g[r % len(g):] + g[: r % len(g)]]
            for path in ordered:
                try:
                    row[path.name] = (await measure(path, args.seq, args.conc, args.concurrency)).summary()
                except Exception as e:  # a peer that breaks mid-run is a note, not a lost run
                    notes.append(f"round {r + 1} {path.name}: {type(e).__name__}: {e}"[:300])
                    continue
                got = row[path.name]
                print(f"round {r + 1} {path.name}: p50 {got['p50_us']:.0f} us, {got['calls_per_s']:.0f} calls/s, "
                      f"CPU us/call {_cpu_text(got)}", flush=True)
            rounds.append(row)
        names = [p.name for p in paths]
        summary: dict[str, dict[str, Any]] = {}
        for n in names:
            got = [r[n] for r in rounds if n in r]
            if not got:
                continue
            summary[n] = {k: statistics.median(g[k] for g in got) for k in ("p50_us", "p99_us", "calls_per_s")}
            for phase in ("cpu_us_per_call_seq", "cpu_us_per_call_conc"):
                summary[n][phase] = {label: statistics.median(g[phase][label] for g in got) for label in got[0][phase]}
        return {"rounds": rounds, "summary": summary, "notes": notes, "targets": _targets(rounds, names),
                "settings": {"rounds": args.rounds, "seq_calls": args.seq, "conc_calls": args.conc,
                             "concurrency": args.concurrency, "before": args.before, "face_args": args.face_args}}
    finally:
        for close in closers:
            await close()
        for proc in reversed(procs):
            proc.stop()


def _cpu_text(got: dict[str, Any]) -> str:
    seq, conc = got["cpu_us_per_call_seq"], got["cpu_us_per_call_conc"]
    return ", ".join(f"{k} {seq[k]:.0f}/{conc[k]:.0f}" for k in seq if k != "child")


def _targets(rounds: list[dict[str, dict[str, Any]]], names: list[str]) -> list[dict[str, Any]]:
    """Per client: the face's calls/s at 32 in flight over the best peer's, and its p50 over the best
    peer's, each taken within a round (the medians of those ratios)."""
    out = []
    for suffix, client in (("", SDK), (" [lean]", LEAN)):
        face = f"{FACE}{suffix}"
        peers = [n for n in names if n.endswith(suffix) and not n.startswith(FACE) and n != BUS_LEG and
                 (suffix or not n.endswith("]"))]
        rate, p50 = [], []
        for r in rounds:
            there = [p for p in peers if p in r]
            if face not in r or not there:
                continue
            rate.append(r[face]["calls_per_s"] / max(r[p]["calls_per_s"] for p in there))
            p50.append(r[face]["p50_us"] / min(r[p]["p50_us"] for p in there))
        if rate:
            out.append({"client": client, "rate_ratio": statistics.median(rate), "p50_ratio": statistics.median(p50),
                        "rate_rounds": rate, "p50_rounds": p50})
    return out


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = ["| path | p50 (us) | p99 (us) | calls/s @32 | CPU us/call, seq / @32 |", "|---|---|---|---|---|"]
    for name, row in s.items():
        seq, conc = row["cpu_us_per_call_seq"], row["cpu_us_per_call_conc"]
        cpu = ", ".join(f"{k} {seq[k]:.0f} / {conc[k]:.0f}" for k in seq if k != "child")
        lines.append(f"| {name} | {row['p50_us']:.0f} | {row['p99_us']:.0f} | {row['calls_per_s']:.0f} | {cpu} |")
    lines.append("")
    for t in results["targets"]:
        rate_ok = "met" if t["rate_ratio"] >= 3 else "NOT met"
        p50_ok = "met" if t["p50_ratio"] <= 0.6 else "NOT met"
        lines.append(f"{t['client']}: face calls/s / best peer's {t['rate_ratio']:.2f}x (goal >= 3x: {rate_ok}); "
                     f"face p50 / best peer's {t['p50_ratio']:.2f} (goal <= 0.6: {p50_ok}); per round "
                     f"{', '.join(f'{x:.2f}' for x in t['rate_rounds'])} / {', '.join(f'{x:.2f}' for x in t['p50_rounds'])}")
    return "\n".join(lines + [f"- {n}" for n in results["notes"]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.face", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq", type=int, default=300, help="sequential calls per path per round (p50, p99)")
    p.add_argument("--conc", type=int, default=1500, help="concurrent calls per path per round (calls/s)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", default=str(BENCH / "face-results.json"))
    p.add_argument("--before", default="", help="a git ref whose face is measured beside this one (e.g. main)")
    p.add_argument("--face-args", nargs=argparse.REMAINDER, default=[],
                   help="more arguments for this checkout's `meshctl mcp` (last on the line)")
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
