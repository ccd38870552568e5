"""What authorization costs the HTTP face: `meshctl mcp --http` with `--auth-issuer` (every request's
bearer token checked, from the token cache after its first) beside the same face without, in one
run, on the README's default set-up (a node on its embedded bus, both faces logged in as its face
user), the test authorization server (tests/support/oauth_server.py) issuing the token.

The lean HTTP client (bench/lean_http.py, about 20 us of CPU a call) calls the echo child's tool
on a 2025-11-25 session, through the hot path: `--seq` calls one at a time (p50, p99), then
`--conc` calls 32 at a time (calls/s). Rounds alternate which face goes first; the figures are
medians over rounds, the ratios medians of the ratios within a round.

    .venv/bin/python -m bench.face_auth [--rounds 3] [--seq 400] [--conc 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .lean_http import LeanMcpHttp
from .modules import BENCH, echo_module
from .nodes import meshctl, node_source
from .procs import Proc, free_port, wait_port

sys.path.insert(0, str(node_source()))
from tests.support.oauth_server import oauth_server  # noqa: E402


def _bearer(token_text: str) -> type[LeanMcpHttp]:
    header = b"authorization: Bearer " + token_text.encode() + b"\r\n"

    class WithToken(LeanMcpHttp):
        token = token_text
        def _head(self, method: bytes, body: bytes, extra: bytes) -> bytes:
            return super()._head(method, body, extra + header)

    return WithToken


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def _measure(client_class: type[LeanMcpHttp], url: str, seq: int, conc: int) -> dict[str, float]:
    client = await client_class.open(url, connections=32)
    try:
        tail, extra = client.call_bytes("echo_echo", {"text": "hello"})
        for _ in range(50):  # warm: the token cache, the session, the face's pages
            await client.call_prepared(tail, extra)
        times = []
        for _ in range(seq):
            start = time.perf_counter()
            await client.call_prepared(tail, extra)
            times.append(time.perf_counter() - start)
        left = conc

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await client.call_prepared(tail, extra)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(32)))
        elapsed = time.perf_counter() - start
    finally:
        await client.close()
    return {"p50_us": _percentile(times, 0.5) * 1e6, "p99_us": _percentile(times, 0.99) * 1e6,
            "calls_per_s": conc / elapsed}


async def _gate_cost(issuer: str, token: str, url: str, calls: int = 20000) -> dict[str, float]:
    """The Gate alone, in this process, in front of an app that answers nothing: us per request with
    a cached token against without auth (the part of the face's cost that authorization adds)."""
    from urllib.parse import urlsplit

    from runtime.meshctl.face.auth import Gate, load_http_settings

    port = urlsplit(url).port or 0
    found = {}
    for name, given in (("auth off", None), ("auth on", issuer)):
        settings = load_http_settings("127.0.0.1", port, None, issuer=given, audience=None, scopes=[],
                                      allow_unauthenticated=False, resource=url)

        async def inner(scope: Any, receive: Any, send: Any) -> None:
            pass

        gate = Gate(inner, settings)
        headers = [(b"host", f"127.0.0.1:{port}".encode()), (b"content-type", b"application/json"),
                   (b"mcp-session-id", b"s"), (b"authorization", b"Bearer " + token.encode())]

        async def send(message: Any) -> None:
            raise AssertionError(f"the gate answered: {message}")

        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "client": ("127.0.0.1", 1)}
        await gate(dict(scope), None, send)  # the token verified once (the JWKS fetched), then cached
        start = time.perf_counter()
        for _ in range(calls):
            await gate(dict(scope), None, send)
        found[name] = (time.perf_counter() - start) / calls * 1e6
        await gate.aclose()
    return found


async def _bus_leg(state: Path, calls: int = 2000) -> dict[str, float]:
    """The face's bus leg alone (MeshClient, logged in as the face user, a delegate), one call at a
    time: p50 without a person and with one (what crossing the bus with the person costs)."""
    from runtime.bus.connect import connect
    from runtime.client import MeshClient
    from runtime.meshctl.settings import login
    from runtime.wire.identity import Person

    found = login(argparse.Namespace(state_dir=str(state), config=None), "face")
    nc = await connect(found.cfg, "bench-bus-leg", quiet=True)
    client = MeshClient(nc)
    person = Person(iss="http://127.0.0.1:1", sub="service", name="service")
    result = {}
    try:
        for name, who in (("no person", None), ("person", person), ("no person again", None), ("person again", person)):
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                await client.call("mesh.tool.echo.echo", b'{"text":"hello"}', timeout_s=30, on_progress=lambda f: None,
                                  person=who)
                times.append(time.perf_counter() - start)
            result[name] = _percentile(times, 0.5) * 1e6
    finally:
        await client.close()
        await nc.close()
    return result


def _wait_echo(work: Path, state: Path, proc: Proc) -> None:
    import subprocess

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run = subprocess.run([*meshctl(), "call", "tool.echo.echo", '{"text":"hi"}', "--state-dir", str(state)],
                             capture_output=True, text=True, cwd=node_source())
        if run.returncode == 0:
            return
        if not proc.alive():
            raise RuntimeError(f"the node exited: {proc.tail(20)}")
        time.sleep(0.5)
    raise RuntimeError(f"tool.echo.echo did not answer: {run.stderr[-500:]}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = BENCH / ".work-face-auth"
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    procs: list[Proc] = []
    try:
        manifests = work / "modules"
        echo_module(manifests, "echo")
        state = work / "state"
        node = Proc("node", [*meshctl(), "node", "run", "--manifests", str(manifests), "--name", "bench-auth",
                             "--state-dir", str(state)], work / "logs" / "node.log", cwd=node_source())
        procs.append(node)
        _wait_echo(work, state, node)
        with oauth_server(work) as auth:
            faces: dict[str, tuple[str, type[LeanMcpHttp]]] = {}
            for name in ("auth off", "auth on"):
                port = free_port()
                extra = ["--auth-issuer", auth.url] if name == "auth on" else []
                face = Proc(name, [*meshctl(), "mcp", "--state-dir", str(state), "--http", f"127.0.0.1:{port}",
                                   "--only", "echo_*", *extra], work / "logs" / f"face-{name.replace(' ', '-')}.log",
                            cwd=node_source())
                procs.append(face)
                wait_port(port, 30, face.popen, name)
                url = f"http://127.0.0.1:{port}/mcp"
                client_class = LeanMcpHttp
                if name == "auth on":
                    form = {"grant_type": "client_credentials", "resource": url, "client_id": "service",
                            "client_secret": "service-secret", "scope": "mesh"}
                    request = urllib.request.Request(auth.url + "/token", urllib.parse.urlencode(form).encode())
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        client_class = _bearer(json.loads(answer.read())["access_token"])
                faces[name] = (url, client_class)
            rounds: list[dict[str, dict[str, float]]] = []
            for r in range(args.rounds):
                row = {}
                for name in (["auth off", "auth on"] if r % 2 == 0 else ["auth on", "auth off"]):
                    url, client_class = faces[name]
                    row[name] = await _measure(client_class, url, args.seq, args.conc)
                    got = row[name]
                    print(f"round {r + 1} {name}: p50 {got['p50_us']:.0f} us, p99 {got['p99_us']:.0f} us, "
                          f"{got['calls_per_s']:.0f} calls/s", flush=True)
                rounds.append(row)
            tokens = auth.state()["counts"].get("tokens_issued", 0)
            on_url, on_class = faces["auth on"]
            gate_us = await _gate_cost(auth.url, on_class.token, on_url)  # type: ignore[attr-defined]
        bus_leg = await _bus_leg(state)
    finally:
        for proc in reversed(procs):
            proc.stop()
    summary = {name: {k: statistics.median(r[name][k] for r in rounds) for k in ("p50_us", "p99_us", "calls_per_s")}
               for name in ("auth off", "auth on")}
    ratios = {
        "p50 on/off": statistics.median(r["auth on"]["p50_us"] / r["auth off"]["p50_us"] for r in rounds),
        "calls/s on/off": statistics.median(r["auth on"]["calls_per_s"] / r["auth off"]["calls_per_s"] for r in rounds),
    }
    return {"summary": summary, "ratios": ratios, "rounds": rounds, "tokens_issued": tokens, "gate_us": gate_us, "bus_leg_p50_us": bus_leg,
            "settings": {"rounds": args.rounds, "seq": args.seq, "conc": args.conc, "concurrency": 32}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq", type=int, default=400)
    parser.add_argument("--conc", type=int, default=4000)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print()
    print(f"{'':10} {'p50 us':>8} {'p99 us':>8} {'calls/s':>9}")
    for name, got in result["summary"].items():
        print(f"{name:10} {got['p50_us']:8.0f} {got['p99_us']:8.0f} {got['calls_per_s']:9.0f}")
    print(f"auth on / off: p50 x{result['ratios']['p50 on/off']:.3f}, calls/s x{result['ratios']['calls/s on/off']:.3f}")
    gate = result["gate_us"]
    print(f"the Gate alone, per request: {gate['auth off']:.1f} us without auth, {gate['auth on']:.1f} us with a cached token")
    leg = result["bus_leg_p50_us"]
    print("the bus leg alone, p50: " + ", ".join(f"{k} {v:.0f} us" for k, v in leg.items()))
    out = BENCH / "face-auth-results.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
