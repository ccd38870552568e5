"""A caller in a process of its own: calls one tool again and again until its stdin closes, one JSON
line per call on stdout (`{"i": 1, "code": 200, "ok": true, "s": 0.004}`).

Why a process: a test that floods the bus from its own event loop starves that loop, and a call the
test makes beside the flood is then late by the test's own doing (a 15 s timeout seen firing after
18.4 s under load). Measured from here, a late answer is the node's.

Run: `python -m tests.support.steady_caller URL SUBJECT [--pause S] [--timeout S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from tests.support.mesh import call, client


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("subject")
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=15)
    args = parser.parse_args()
    nc = await client(args.url)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(sys.stdin.fileno(), 4096) else None)
    print(json.dumps({"ready": True}), flush=True)
    i = 0
    while not stop.is_set():
        i += 1
        began = time.monotonic()
        line: dict[str, object] = {"i": i}
        try:
            code, body = await call(nc, args.subject, {"i": i}, timeout=args.timeout)
            line |= {"code": code, "ok": code == 200 and body.get("structuredContent") == {"i": i}}
            if not line["ok"]:
                line["body"] = body
        except Exception as e:  # a lost call: what the test that runs this looks for
            line |= {"code": repr(e), "ok": False}
        line["s"] = round(time.monotonic() - began, 4)
        print(json.dumps(line), flush=True)
        await asyncio.sleep(args.pause)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
