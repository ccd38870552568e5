"""What the caller stamp costs per call, in process: `CallerStamp.for_headers` as the dispatcher
calls it for every request (runtime/calls/identity.py).

`.venv/bin/python -m bench.caller_stamp [--count N]`. Prints ns per call for each case and the
load average; asserts nothing (speed goals are read, not tested).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

from runtime.calls.identity import CallerStamp
from runtime.wire.identity import REQUEST_INFO, Person, encode_person, local_caller

STAMP = json.dumps(
    {"start": "2026-12-01T03:19:50.84769323Z", "host": "127.0.0.1", "id": 9, "acc": "alice", "user": "alice",
     "name": "alice-client", "lang": "python3", "ver": "2.16.0", "rtt": 835987, "kind": "Client", "client_type": "nats"}
)
FACE = json.dumps({"acc": "faces", "user": "mesh-mcp", "name": "meshctl-mcp", "kind": "Client"})
PERSON = encode_person(Person(iss="https://idp.example/", sub="u-1", name="Alice"))


def per_call(fn: Callable[[int], object], count: int) -> float:
    """Best of five runs of `count` calls, in ns per call."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        for i in range(count):
            fn(i)
        best = min(best, (time.perf_counter_ns() - start) / count)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    count = parser.parse_args().count
    stamp = CallerStamp(local_caller("ops"), {("faces", "mesh-mcp"): "mcp"}, operator=("LOCAL", "mesh-local"))
    unverified = CallerStamp(local_caller("ops"), stamped=False)
    plain, stamped, face = {"Mesh-Call-Id": "x" * 22}, {REQUEST_INFO: STAMP}, {REQUEST_INFO: FACE}
    new = [{REQUEST_INFO: json.dumps({"acc": f"a{i}", "user": "u"})} for i in range(min(count, 20_000))]
    cases = {
        "no stamp (local)": lambda i: stamp.for_headers(plain),
        "a caller seen before": lambda i: stamp.for_headers(stamped),
        "a delegate with a person seen before": lambda i: stamp.for_headers(face, PERSON),
        "a new caller each call": lambda i: stamp.for_headers(new[i % len(new)]),
        "a bus that vouches for nobody": lambda i: unverified.for_headers(stamped, PERSON),
    }
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"CallerStamp.for_headers, best of 5 x {count} calls; load average {load} (this machine, not asserted)")
    for name, fn in cases.items():
        n = len(new) if name.startswith("a new") else count
        if name.startswith("a new"):
            stamp._cache.clear()
        print(f"  {name:40s} {per_call(fn, n):8.0f} ns/call")


if __name__ == "__main__":
    main()
