"""Load and soak: many calls over several bundles in several languages while children are killed.

One run starts its own nats-server on loopback and one node process serving module folders from
source, sends `--calls` tool calls at a fixed concurrency, SIGKILLs a random child every few
seconds, then stops the node and looks for what should not be there: calls nobody answered,
calls answered twice, processes of the node still alive after it stopped.

Every call is published with a reply subject of its own under one wildcard inbox, so each reply
is counted against the call it belongs to (that is how duplicates are seen) and every call ends
in exactly one outcome: ok, a clear runtime error (503/504 with a JSON body), wrong (any other
answer: a bug), or unanswered (timeout or no responders: a bug).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.support.mesh import NatsServer, make_module, marked_processes

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LAST_RUN = HERE / "last-run.json"
HEADER_CODE = "Nats-Service-Error-Code"
HEADER_TEXT = "Nats-Service-Error"

# Tolerant of a kill every few seconds: a bundle must never reach `failed` during the run.
NODE_CONFIG = """
drain_timeout_s = 10
[restart]
max_restarts = 1000
window_s = 60
backoff_initial_s = 0.05
backoff_max_s = 0.5
stable_after_s = 1
[health]
init_timeout_s = 20
ping_interval_s = 5
ping_timeout_s = 5
ping_misses = 2
stop_grace_s = 2
"""
RAW_TIMEOUT_MS = 10_000
HELLO_TIMEOUT_MS = 30_000  # the manifest default, which the hello-* modules keep


@dataclass
class Target:
    """One served bundle and how to call it and check its answer."""

    module: str
    language: str
    tool: str  # "echo" (raw child: answers its arguments) or "greet" (hello-*: "Hello, <name>!")

    @property
    def key(self) -> str:
        return f"{self.module}/tools"

    @property
    def subject(self) -> str:
        return f"mesh.tool.{self.module}.{self.tool}"


@dataclass
class Call:
    target: Target
    future: asyncio.Future[Msg]
    replies: int = 0


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    clear: collections.Counter[int] = field(default_factory=collections.Counter)
    wrong: int = 0
    timeouts: int = 0
    no_responders: int = 0
    late_replies: int = 0
    stray_replies: int = 0
    kills: int = 0
    per_bundle: dict[str, collections.Counter[str]] = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    error_samples: collections.Counter[str] = field(default_factory=collections.Counter)
    wrong_samples: list[str] = field(default_factory=list)

    @property
    def unanswered(self) -> int:
        return self.timeouts + self.no_responders


# --- setup: module folders, bus, node ---------------------------------------------------------
def make_manifests(folder: Path, raw: int, hello: list[str]) -> list[Target]:
    """Raw python children (copies of the test child under distinct names) and the hello-* modules."""
    folder.mkdir(parents=True)
    targets = []
    for i in range(raw):
        name = f"soak-raw-{chr(ord('a') + i)}"
        make_module(folder, name, timeout_ms=RAW_TIMEOUT_MS)
        targets.append(Target(name, "python", "echo"))
    for language in hello:
        source = ROOT / "bundles" / f"hello-{language}"
        if not (source / "module.toml").is_file():
            raise SystemExit(f"soak: no module {source}; --hello names languages with a bundles/hello-<language>")
        # A link, not a copy: the manifest loader resolves it, so the toolchains still find this
        # checkout's SDKs and the node builds compiled bundles with the usual caches.
        (folder / source.name).symlink_to(source)
        targets.append(Target(source.name, language, "greet"))
    return targets


def start_node(work: Path, manifests: Path, url: str, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    config = work / "node.toml"
    config.write_text(NODE_CONFIG)
    log_path = work / "node.log"
    argv = [sys.executable, "-m", "runtime.meshctl", "node", "run", "--manifests", str(manifests), "--nats", url,
            "--name", name, "--state-dir", str(work / "state"), "--config", str(config)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
    return proc, log_path


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def is_child_of(pid: int, node: str) -> bool:
    """Kill only what is ours: the pid still carries this node's marker (pids are reused)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"MESH_NODE={node}".encode() in f.read().split(b"\0")
    except OSError:
        return False


async def node_status(nc: Client, node: str) -> dict[str, Any]:
    msg = await nc.request(f"mesh.node.{node}.status", b"", timeout=10)
    return json.loads(msg.data)


def by_key(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{b['module']}/{b['bundle']}": b for b in status["bundles"]}


async def wait_ready(nc: Client, node: str, proc: subprocess.Popen[bytes], targets: list[Target],
                     timeout: float) -> tuple[list[Target], dict[str, str]]:
    """Wait until each bundle is `ready` (compiled ones are `building` first) or has failed."""
    deadline = time.monotonic() + timeout
    last_print = 0.0
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"soak: the node exited with code {proc.returncode} while starting")
        try:
            found = by_key(await node_status(nc, node))
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            await asyncio.sleep(0.5)
            continue
        states = {t.key: found.get(t.key, {}).get("state", "absent") for t in targets}
        if all(s in ("ready", "failed") for s in states.values()):
            failed = {t.key: found[t.key].get("last_error") or "failed" for t in targets if states[t.key] == "failed"}
            return [t for t in targets if states[t.key] == "ready"], failed
        if time.monotonic() - last_print > 10:
            last_print = time.monotonic()
            print("soak: waiting for bundles: " + ", ".join(f"{k} {s}" for k, s in states.items()), flush=True)
        await asyncio.sleep(0.5)
    late = {k: f"still {s} after {timeout:.0f} s" for k, s in states.items() if s != "ready"}
    return [t for t in targets if states.get(t.key) == "ready"], late


# --- the load ---------------------------------------------------------------------------------
def classify(msg: Msg, call_id: int, target: Target, tally: Tally) -> None:
    """Record one call's first reply: ok, a clear runtime error, or wrong."""
    counts = tally.per_bundle[target.key]
    headers = msg.headers or {}
    if HEADER_CODE not in headers and headers.get("Status") == "503" and not msg.data:
        tally.no_responders += 1  # nobody subscribed: the node's subscription went away
        counts["no_responders"] += 1
        return
    if HEADER_CODE in headers:
        code = int(headers[HEADER_CODE])
        try:
            body_ok = isinstance(json.loads(msg.data), dict)
        except ValueError:
            body_ok = False
        if code in (503, 504) and body_ok:
            tally.clear[code] += 1
            counts[f"error_{code}"] += 1
            # The text names the bundle, its state and last exit: a few kinds, shown in the summary.
            tally.error_samples[f"{code} {target.key}: {headers.get(HEADER_TEXT, '')[:110]}"] += 1
            return
        return wrong(tally, counts, f"{target.key} call {call_id}: {code} {headers.get(HEADER_TEXT, '')} {msg.data[:200]!r}")
    try:
        result = json.loads(msg.data)
    except ValueError:
        return wrong(tally, counts, f"{target.key} call {call_id}: not JSON: {msg.data[:200]!r}")
    if not result.get("isError"):
        if target.tool == "echo" and (result.get("structuredContent") or {}).get("id") == call_id:
            tally.ok += 1
            counts["ok"] += 1
            return
        texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict)]
        if target.tool == "greet" and any(f"Hello, soak-{call_id}!" in t for t in texts):
            tally.ok += 1
            counts["ok"] += 1
            return
    wrong(tally, counts, f"{target.key} call {call_id}: unexpected answer {msg.data[:200]!r}")


def wrong(tally: Tally, counts: collections.Counter[str], sample: str) -> None:
    tally.wrong += 1
    counts["wrong"] += 1
    if len(tally.wrong_samples) < 10:
        tally.wrong_samples.append(sample)


async def load(nc: Client, targets: list[Target], args: argparse.Namespace, send_deadline: float,
               tally: Tally, calls: dict[int, Call]) -> None:
    rng = random.Random(args.seed)
    inbox = nc.new_inbox()  # _INBOX.<unique>; each call replies to <inbox>.<call id>

    async def on_reply(msg: Msg) -> None:
        call_id = int(msg.subject.rsplit(".", 1)[1])
        call = calls.get(call_id)
        if call is None:
            tally.stray_replies += 1
            return
        call.replies += 1  # more than one is a duplicate, counted at the end
        if call.future.cancelled():
            tally.late_replies += 1  # its caller gave up (counted unanswered): the answer came too late
        elif not call.future.done():
            call.future.set_result(msg)

    sub = await nc.subscribe(f"{inbox}.*", cb=on_reply, pending_msgs_limit=-1, pending_bytes_limit=-1)
    loop = asyncio.get_running_loop()
    next_id = iter(range(args.calls))

    async def worker() -> None:
        for call_id in next_id:
            if time.monotonic() >= send_deadline:
                return
            target = rng.choice(targets)
            args_obj = {"id": call_id} if target.tool == "echo" else {"name": f"soak-{call_id}"}
            call = Call(target, loop.create_future())
            calls[call_id] = call
            tally.sent += 1
            await nc.publish(target.subject, json.dumps(args_obj).encode(), reply=f"{inbox}.{call_id}")
            try:
                msg = await asyncio.wait_for(call.future, args.call_timeout)
            except asyncio.TimeoutError:  # the future is cancelled: a reply after this is "late"
                tally.timeouts += 1
                tally.per_bundle[target.key]["timeout"] += 1
                continue
            classify(msg, call_id, target, tally)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    # Replies that come after their call ended (a second answer to the same call) still count.
    await nc.flush()
    await asyncio.sleep(args.settle)
    await sub.unsubscribe()


async def killer(nc: Client, node: str, targets: list[Target], args: argparse.Namespace, stop: asyncio.Event,
                 tally: Tally) -> None:
    """Every --kill-every seconds (50-150 % jitter), SIGKILL the child of a random ready bundle."""
    rng = random.Random(args.seed + 1)
    keys = {t.key for t in targets}
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), args.kill_every * rng.uniform(0.5, 1.5))
            return
        except asyncio.TimeoutError:
            pass
        try:
            found = by_key(await node_status(nc, node))
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            print(f"soak: status did not answer ({type(e).__name__}); no kill this round", flush=True)
            continue
        ready = [b for k, b in found.items() if k in keys and b["state"] == "ready" and b["pid"]]
        if not ready:
            continue
        victim = rng.choice(ready)
        if is_child_of(victim["pid"], node):
            try:
                os.kill(victim["pid"], signal.SIGKILL)
                tally.kills += 1
            except ProcessLookupError:
                pass


async def progress(tally: Tally, started: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10)
        except asyncio.TimeoutError:
            pass
        elapsed = time.monotonic() - started
        print(f"soak: {elapsed:6.0f} s  sent {tally.sent}  ok {tally.ok}  errors {sum(tally.clear.values())}  "
              f"wrong {tally.wrong}  unanswered {tally.unanswered}  kills {tally.kills}  "
              f"{tally.sent / max(elapsed, 1e-9):.0f} calls/s", flush=True)


# --- the run ------------------------------------------------------------------------------------
async def soak(args: argparse.Namespace, work: Path, started: float) -> dict[str, Any]:
    hard_deadline = started + args.max_seconds
    node_name = f"soak-{os.getpid()}"
    targets = make_manifests(work / "modules", args.raw, args.hello)
    server = NatsServer(work / "nats").start()
    proc, log_path = start_node(work, work / "modules", server.url, node_name)
    report: dict[str, Any] = {"node": node_name, "work": str(work), "node_log": str(log_path)}
    nc: Client | None = None
    try:
        nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                pending_size=16 * 1024 * 1024)
        print(f"soak: node {node_name} (pid {proc.pid}) on {server.url}; waiting for "
              f"{len(targets)} bundles (compiled ones are built first)", flush=True)
        served, failed = await wait_ready(nc, node_name, proc, targets, max(hard_deadline - time.monotonic(), 1))
        for key, why in failed.items():
            print(f"soak: {key} is not served: {why[:300]}", flush=True)
        languages = sorted({t.language for t in served})
        report["bundles"] = {t.key: t.language for t in served}
        report["not_served"] = failed
        if len(served) < 5 or len(languages) < 3:
            raise SystemExit(f"soak: only {len(served)} bundles in {len(languages)} languages are ready "
                             f"({', '.join(languages)}); the soak needs 5 bundles in 3 languages")
        before = by_key(await node_status(nc, node_name))
        rss_start = rss_kib(proc.pid)
        print(f"soak: serving {len(served)} bundles in {len(languages)} languages ({', '.join(languages)}); "
              f"node RSS {rss_start} KiB; sending {args.calls} calls at concurrency {args.concurrency}, "
              f"a kill every ~{args.kill_every:g} s", flush=True)

        tally = Tally()
        calls: dict[int, Call] = {}
        stop = asyncio.Event()
        load_started = time.monotonic()
        rss_peak = rss_start or 0

        async def sample_rss() -> None:
            nonlocal rss_peak
            while not stop.is_set():
                rss_peak = max(rss_peak, rss_kib(proc.pid) or 0)
                await asyncio.sleep(1)

        side = [asyncio.create_task(killer(nc, node_name, served, args, stop, tally)),
                asyncio.create_task(progress(tally, load_started, stop)),
                asyncio.create_task(sample_rss())]
        try:
            await load(nc, served, args, hard_deadline, tally, calls)
        finally:
            stop.set()
            await asyncio.gather(*side, return_exceptions=True)
        load_seconds = time.monotonic() - load_started - args.settle
        duplicates = sum(1 for c in calls.values() if c.replies > 1)

        # The bundles come back after the last kill; then the node's memory at the end.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            after = by_key(await node_status(nc, node_name))
            if all(after[t.key]["state"] == "ready" for t in served):
                break
            await asyncio.sleep(0.2)
        rss_end = rss_kib(proc.pid)
        restarts = {t.key: after[t.key]["restarts"] - before[t.key]["restarts"] for t in served}
        report.update(
            calls_requested=args.calls,
            calls_sent=tally.sent,
            ok=tally.ok,
            clear_errors={str(k): v for k, v in sorted(tally.clear.items())},
            wrong=tally.wrong,
            unanswered=tally.unanswered,
            unanswered_timeout=tally.timeouts,
            unanswered_no_responders=tally.no_responders,
            duplicates=duplicates,
            late_replies=tally.late_replies,
            stray_replies=tally.stray_replies,
            kills=tally.kills,
            restarts=restarts,
            restarts_total=sum(restarts.values()),
            states_at_end={t.key: after[t.key]["state"] for t in served},
            per_bundle={k: dict(v) for k, v in sorted(tally.per_bundle.items())},
            error_kinds=dict(tally.error_samples.most_common(12)),
            wrong_samples=tally.wrong_samples,
            rss_kib_start=rss_start,
            rss_kib_end=rss_end,
            rss_kib_peak=max(rss_peak, rss_end or 0),
            load_seconds=round(load_seconds, 1),
            calls_per_s=round(tally.sent / max(load_seconds, 1e-9), 1),
            hit_max_seconds=tally.sent < args.calls,
        )
    finally:
        if nc is not None:
            await nc.close()
        # Stop the node the way an operator does; then nothing of it may be left.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            report["node_exit"] = proc.wait(60)
        except subprocess.TimeoutExpired:
            report["node_exit"] = "did not exit within 60 s of SIGTERM (killed)"
            proc.kill()
            proc.wait()
        leaked = marked_processes(node_name)
        report["leaked"] = len(leaked)
        report["leaked_pids"] = leaked
        if leaked:  # name them, then end them: the soak leaves nothing behind either
            report["leaked_cmdlines"] = [_cmdline(p) for p in leaked]
            for pid in leaked:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        server.stop()
        node_log = log_path.read_text(errors="replace") if log_path.exists() else ""
        report["node_log_tracebacks"] = node_log.count("Traceback")
        report["node_log_errors"] = sum(1 for line in node_log.splitlines() if " ERROR " in line)
    return report


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def verdict(report: dict[str, Any]) -> list[str]:
    """What makes the run fail; empty when it passed."""
    problems = []
    for name in ("unanswered", "duplicates", "leaked", "wrong"):
        if report.get(name, 1) != 0:
            problems.append(f"{name} = {report.get(name)}")
    if report.get("node_exit") != 0:
        problems.append(f"node exit = {report.get('node_exit')}")
    return problems


def print_summary(report: dict[str, Any]) -> None:
    rows = [
        ("calls sent", f"{report['calls_sent']} of {report['calls_requested']}"
         + (" (stopped at --max-seconds)" if report["hit_max_seconds"] else "")),
        ("answered ok", report["ok"]),
        ("answered with a clear error", f"{sum(report['clear_errors'].values())} "
         + " ".join(f"({n} x {c})" for c, n in report["clear_errors"].items())),
        ("answered wrong", report["wrong"]),
        ("unanswered", f"{report['unanswered']} (timeout {report['unanswered_timeout']}, "
         f"no responders {report['unanswered_no_responders']})"),
        ("duplicates", f"{report['duplicates']} (late replies {report['late_replies']}, stray {report['stray_replies']})"),
        ("leaked processes", report["leaked"]),
        ("kills", report["kills"]),
        ("restarts seen", f"{report['restarts_total']} "
         + " ".join(f"{k.split('/')[0]}={v}" for k, v in report["restarts"].items())),
        ("bundles at end", " ".join(f"{k.split('/')[0]}={v}" for k, v in report["states_at_end"].items())),
        ("node RSS", f"start {report['rss_kib_start']} KiB, end {report['rss_kib_end']} KiB, "
         f"peak {report['rss_kib_peak']} KiB"),
        ("node exit", report["node_exit"]),
        ("node log", f"{report['node_log_errors']} ERROR lines, {report['node_log_tracebacks']} tracebacks"),
        ("wall time", f"{report['wall_seconds']} s (load {report['load_seconds']} s)"),
        ("calls/s", report["calls_per_s"]),
    ]
    print()
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value}")
    print("\n  per bundle:")
    for key, counts in report["per_bundle"].items():
        print(f"    {key.ljust(24)} {report['bundles'][key].ljust(10)} "
              + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if report["error_kinds"]:
        print("\n  clear errors, most common first:")
        for text, n in report["error_kinds"].items():
            print(f"    {n:6d}  {text}")
    for sample in report["wrong_samples"]:
        print(f"  WRONG: {sample}")
    for pid, cmd in zip(report.get("leaked_pids", []), report.get("leaked_cmdlines", [])):
        print(f"  LEAKED: pid {pid}: {cmd}")
    print()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=100_000, help="calls to send (default 100000)")
    p.add_argument("--concurrency", type=int, default=32, help="calls in flight at once (default 32)")
    p.add_argument("--kill-every", type=float, default=3.0, help="seconds between child kills, +-50%% jitter (default 3)")
    p.add_argument("--max-seconds", type=float, default=900.0,
                   help="hard bound on the run from its start: no call is sent after it (default 900)")
    p.add_argument("--seed", type=int, default=0, help="seed for the choice of bundles and victims (default 0)")
    p.add_argument("--raw", type=int, default=2, help="raw python test children to serve (default 2)")
    p.add_argument("--hello", default="python,go,c,typescript,rust",
                   help="hello-<language> modules to serve (default python,go,c,typescript,rust; one that does not "
                        "build is named and left out, as long as 5 bundles in 3 languages remain)")
    p.add_argument("--call-timeout", type=float, default=HELLO_TIMEOUT_MS / 1000 + 5,
                   help="seconds a call waits for its reply before it counts as unanswered (default 35: "
                        "longer than every bundle's own timeout, so the node answers 504 first)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds to keep counting replies after the last call")
    p.add_argument("--keep", action="store_true", help="keep the work folder (node log, state) even when the run passed")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.hello = [h.strip() for h in args.hello.split(",") if h.strip()]
    if args.calls < 1 or args.concurrency < 1 or args.kill_every <= 0 or args.max_seconds <= 0 or not 0 <= args.raw <= 26:
        print("soak: --calls, --concurrency, --kill-every and --max-seconds must be positive; --raw 0..26", file=sys.stderr)
        return 2
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="mesh-soak-"))
    print(f"soak: work folder {work}", flush=True)
    try:
        report = asyncio.run(soak(args, work, started))
    except KeyboardInterrupt:
        print(f"soak: interrupted; work folder kept: {work}", file=sys.stderr)
        return 130
    except SystemExit as e:
        if (work / "node.log").exists():
            print(f"{e}; work folder kept: {work}", file=sys.stderr)
        else:  # nothing was started: nothing to look at
            print(e, file=sys.stderr)
            shutil.rmtree(work, ignore_errors=True)
        return 1
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    report["command"] = " ".join(["python -m bench.soak", *(argv if argv is not None else sys.argv[1:])])
    report["seed"] = args.seed
    problems = verdict(report)
    report["passed"] = not problems
    LAST_RUN.write_text(json.dumps(report, indent=2) + "\n")
    print_summary(report)
    if problems or args.keep:
        print(f"soak: work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"soak: {'PASSED' if not problems else 'FAILED: ' + ', '.join(problems)} (written to {LAST_RUN.relative_to(ROOT)})")
    return 0 if not problems else 1
