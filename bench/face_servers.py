"""Which HTTP server for the face's hot path: uvicorn (httptools or h11, on uvloop) against granian
(its ASGI and RSGI interfaces, embedded in the process's asyncio loop, as the face must be: the
bus connection lives in that loop). Each server runs one tiny app in a process of its own that
reads a POST body and answers a fixed JSON-RPC result; the lean HTTP client (bench/lean_http.py
style: one keep-alive connection per request in flight) drives it. Prints requests/s at 32 in
flight, p50 of sequential requests and the server's CPU per request.

    .venv/bin/python -m bench.face_servers [--rounds 3] [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from .lean_http import _Connection
from .procs import Proc, cpu_ns, free_port, wait_port

BODY = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\\"text\\":\\"hello\\"}"}],"isError":false}}'

SERVER = r'''
import asyncio, sys
kind, port = sys.argv[1], int(sys.argv[2])
BODY = %r
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]

async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        m = await receive()
        more = m.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})

class RSGI:
    async def __rsgi__(self, scope, proto):
        await proto()
        proto.response_bytes(200, [("content-type", "application/json")], BODY)
    def __rsgi_init__(self, loop): pass
    def __rsgi_del__(self, loop): pass

import uvloop
uvloop.install()

async def main():
    if kind.startswith("uvicorn"):
        import uvicorn
        http = "h11" if kind == "uvicorn-h11" else "httptools"
        config = uvicorn.Config(asgi, host="127.0.0.1", port=port, http=http, loop="none", proxy_headers=False,
                                log_level="warning", lifespan="off", access_log=False)
        await uvicorn.Server(config).serve()
    else:
        from granian.server.embed import Server
        from granian.constants import Interfaces, HTTPModes
        iface = Interfaces.RSGI if kind == "granian-rsgi" else Interfaces.ASGI
        target = RSGI() if kind == "granian-rsgi" else asgi
        server = Server(target, address="127.0.0.1", port=port, interface=iface, http=HTTPModes.http1,
                        websockets=False, log_enabled=False)
        await server.serve()

asyncio.run(main())
''' % BODY

REQUEST = (b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
           b"accept: application/json, text/event-stream\r\ncontent-length: 17\r\n\r\n{\"jsonrpc\":\"2.0\"}")


async def _drive(port: int, pid: int, requests: int, concurrency: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(_Connection, "127.0.0.1", port))[1] for _ in range(concurrency)]
    for c in conns[:4]:
        for _ in range(200):
            await c.request(REQUEST)
    lat = []
    before = cpu_ns(pid)
    for _ in range(2000):
        t = time.perf_counter_ns()
        r = await conns[0].request(REQUEST)
        lat.append(time.perf_counter_ns() - t)
        assert r.status == 200 and r.body == BODY, r.body
    cpu_seq = (cpu_ns(pid) - before) / 1000 / 2000
    left = requests

    async def worker(c: _Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await c.request(REQUEST)

    before = cpu_ns(pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t0
    cpu_conc = (cpu_ns(pid) - before) / 1000 / requests
    for c in conns:
        c.transport.close()
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] / 1000, "per_s": requests / elapsed, "cpu_seq": cpu_seq, "cpu_conc": cpu_conc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.face_servers")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--kinds", default="uvicorn,uvicorn-h11,granian-asgi,granian-rsgi")
    args = p.parse_args(argv)
    work = Path(__file__).resolve().parent / ".work-face" / "servers"
    work.mkdir(parents=True, exist_ok=True)
    (work / "server.py").write_text(SERVER)
    kinds = args.kinds.split(",")
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
            port = free_port()
            proc = Proc(kind, [sys.executable, str(work / "server.py"), kind, str(port)], work / f"{kind}.log")
            try:
                wait_port(port, 20, proc.popen, kind)
                got = asyncio.run(_drive(port, proc.pid, args.requests, 32))
            finally:
                proc.stop()
            rows[kind].append(got)
            print(f"round {r + 1} {kind}: {got['per_s']:.0f} req/s, p50 {got['p50_us']:.0f} us, "
                  f"CPU {got['cpu_seq']:.0f} / {got['cpu_conc']:.0f} us/req", flush=True)
    print(f"\n{'server':14} {'req/s@32':>9} {'p50 us':>7} {'CPU us/req seq':>15} {'CPU us/req @32':>15}")
    for kind, got in rows.items():
        med = {k: statistics.median(g[k] for g in got) for k in got[0]}
        print(f"{kind:14} {med['per_s']:9.0f} {med['p50_us']:7.0f} {med['cpu_seq']:15.1f} {med['cpu_conc']:15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
