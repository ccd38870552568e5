"""What a face pays to know the mesh: the catalogue (issue 31) beside the `$SRV.INFO` look it replaces.

For each mesh size (10, 30, 60 nodes by default) on a fresh nats-server with monitoring on:
N real nodes (`meshctl node run`), each serving a module of its own whose raw echo child lists
20 tools of 600 bytes of definition (12 KB). A watcher (runtime/bus/catalog_watch.py, as a face
runs it) on a connection of its own; the server's `/connz` counts what that connection is sent.
Measured: the first whole read (bytes, ms), the idle rate (beats only), and bytes per change while
one node's bundle is restarted `--restarts` times (and the same less the beats that came
meanwhile: the change's own bytes); beside it, on another connection, one
`$SRV.INFO` look of every node (what the face paid per change and every 15 s before), its bytes
and the time to its last answer. The growth per change must be flat in N; the look's is linear.

Then, in this process, a reader's memory for 100,000 tools (runtime/bus/catalog_view.py fed by
hand, tracemalloc): 2,000 nodes x 50 distinct tools, and 1,000 nodes x 100 tools from 10 modules
(a mesh runs the same modules on many nodes: their lists are held once).

    .venv/bin/python -m bench.catalog [--nodes 10,30,60] [--idle 10] [--restarts 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from .modules import echo_module
from .nodes import connect, meshctl, node_source
from .procs import Proc, free_port, wait_port

TOOLS = "20:600"
CALM = """
drain_timeout_s = 5
[restart]
max_restarts = 50
window_s = 60
backoff_initial_s = 0.1
backoff_max_s = 0.4
stable_after_s = 1
[health]
init_timeout_s = 10
ping_interval_s = 10
ping_timeout_s = 2
ping_misses = 3
stop_grace_s = 1
"""


def out_bytes(monitor: int, cid: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz?cid={cid}", timeout=5) as r:
        return int(json.load(r)["connections"][0]["out_bytes"])


def start_server(work: Path) -> tuple[Proc, str, int]:
    from runtime.bus.embedded import nats_server_binary

    port, monitor = free_port(), free_port()
    argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor), "-js",
            "-sd", str(work / "js")]
    proc = Proc("nats-server", argv, work / "logs" / "nats-server.log")
    wait_port(port, 10, proc.popen, "nats-server")
    wait_port(monitor, 10, proc.popen, "nats-server monitoring")
    return proc, f"nats://127.0.0.1:{port}", monitor


def start_nodes(work: Path, url: str, count: int) -> list[Proc]:
    config = work / "node.toml"
    config.write_text(CALM)
    nodes = []
    for batch in range(0, count, 6):  # a few at a time: interpreters starting at once crowd a small machine
        started = []
        for i in range(batch, min(batch + 6, count)):
            mods = work / f"mods-{i:02}"
            echo_module(mods, f"m{i:02}", env={"BENCH_TOOLS": TOOLS})
            argv = [*meshctl(), "node", "run", "--manifests", str(mods), "--nats", url, "--name", f"n{i:02}",
                    "--state-dir", str(work / f"state-{i:02}"), "--config", str(config)]
            started.append(Proc(f"node n{i:02}", argv, work / "logs" / f"node-{i:02}.log", cwd=node_source()))
        for proc in started:
            deadline = time.monotonic() + 120
            while "serving on" not in proc.log.read_text(errors="replace"):
                if not proc.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.name} did not serve:\n{proc.tail()}")
                time.sleep(0.1)
        nodes += started
    return nodes


async def measure(count: int, idle_s: float, restarts: int) -> dict[str, Any]:
    from runtime.bus.catalog_watch import CatalogWatcher, read_catalog
    from runtime.bus.service_api import collect_infos
    from runtime.wire.catalog import encode
    from runtime.wire.control import RestartAsk
    from runtime.wire.subjects import RESTART, node_subject

    tools_per_node = int(TOOLS.split(":")[0])
    work = Path(tempfile.mkdtemp(prefix=f"bench-catalog-{count}-"))
    procs: list[Proc] = []
    try:
        server, url, monitor = start_server(work)
        procs.append(server)
        procs += start_nodes(work, url, count)
        ops = await connect(url)
        deadline = time.monotonic() + 180
        while len([t for t in (await read_catalog(ops)).tools() if t.state == "ready"]) < count * tools_per_node:
            if time.monotonic() > deadline:
                raise RuntimeError("not every node's tools were ready in the catalogue within 180 s")
            await asyncio.sleep(0.5)

        class Counting(CatalogWatcher):
            """Counts the beats it is sent: a change's own bytes are what came less the beats meanwhile."""

            beats = 0

            async def _on_live(self, msg: Any) -> None:
                if msg.subject.endswith(".beat"):
                    self.beats += 1
                await super()._on_live(msg)

        face = await connect(url)
        cid = face.client_id
        assert cid is not None
        changes: list[float] = []
        watcher = Counting(face, on_change=lambda c: changes.append(time.monotonic()))
        before = out_bytes(monitor, cid)
        t0 = time.monotonic()
        task = asyncio.get_running_loop().create_task(watcher.run())
        while not watcher.ready:
            await asyncio.sleep(0.001)
        first_ms = (time.monotonic() - t0) * 1000
        listed = len(watcher.tools())
        await asyncio.sleep(0.3)
        first_bytes = out_bytes(monitor, cid) - before

        idle_from, beats_from = out_bytes(monitor, cid), watcher.beats
        await asyncio.sleep(idle_s)
        idle_bytes = out_bytes(monitor, cid) - idle_from
        idle_rate = idle_bytes / idle_s
        beat_bytes = idle_bytes / max(1, watcher.beats - beats_from)  # one beat on the wire (and the odd PING)

        per_change, net_change, seen_ms = [], [], []
        for k in range(1, restarts + 1):
            told = len(changes)
            at_bytes, at, beats_at = out_bytes(monitor, cid), time.monotonic(), watcher.beats
            await ops.request(node_subject("n00", RESTART), encode(RestartAsk("m00/tools")), timeout=5)
            while not [b for n in watcher.nodes() if n.node == "n00" for b in n.bundles
                       if b.restarts == k and b.state == "ready"]:
                await asyncio.sleep(0.005)
            seen_ms.append(((changes[told] if len(changes) > told else time.monotonic()) - at) * 1000)
            await asyncio.sleep(0.3)
            spent = out_bytes(monitor, cid) - at_bytes
            per_change.append(spent)
            net_change.append(round(spent - beat_bytes * (watcher.beats - beats_at)))  # less the beats meanwhile
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await face.close()

        # The look the face made before: every node's INFO, on a connection of its own.
        looker = await connect(url)
        lcid = looker.client_id
        assert lcid is not None
        looks = []
        for _ in range(3):
            from_bytes, t1 = out_bytes(monitor, lcid), time.monotonic()
            infos = await collect_infos(looker, 0.4)
            looks.append((out_bytes(monitor, lcid) - from_bytes, len(infos), (time.monotonic() - t1) * 1000))
        await looker.close()
        await ops.close()
        look_bytes = statistics.median(b for b, _, _ in looks)
        change = statistics.median(net_change)
        return {
            "nodes": count,
            "tools": listed,
            "first_read_bytes": first_bytes,
            "first_read_ms": round(first_ms, 1),
            "idle_bytes_per_s": round(idle_rate),
            "bytes_per_beat": round(beat_bytes),
            "bytes_per_change": per_change,
            "bytes_per_change_net": net_change,
            "bytes_per_change_net_median": change,
            "change_seen_ms": [round(s, 1) for s in seen_ms],
            "info_look_bytes": look_bytes,
            "info_look_nodes": looks[0][1],
            "info_look_ms": round(statistics.median(ms for _, _, ms in looks), 1),
            "look_over_change": round(look_bytes / change, 1) if change else None,
            "resyncs": watcher.stats.resyncs,
        }
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def reader_memory(nodes: int, tools: int, modules: int) -> dict[str, Any]:
    """A reader holding `nodes` x `tools` tools whose lists come from `modules` distinct modules."""
    from runtime.bus.catalog import Entry
    from runtime.bus.catalog_view import CatalogView, WatchLimits
    from runtime.wire.catalog import (
        BeatRecord,
        NodeRecord,
        StateRecord,
        ToolDef,
        beat_key,
        defs_key,
        encode,
        node_key,
        split_definitions,
        state_key,
    )

    def definition(module: int, i: int) -> bytes:
        body = {"name": f"gen{i:02}", "description": "", "inputSchema": {"type": "object"}}
        pad = 600 - len(msgspec.json.encode(body))
        body["description"] = (f"Tool {i} of module {module}. " + "." * pad)[:pad]
        return msgspec.json.encode(body)

    lists = []
    for m in range(modules):
        name = f"m{m:04}"
        defs = [ToolDef(f"mesh.tool.{name}.gen{i:02}", "tool", f"gen{i:02}", msgspec.Raw(definition(m, i)))
                for i in range(tools)]
        lists.append((name, split_definitions(name, "tools", defs)))
    gc.collect()
    tracemalloc.start()
    started = time.monotonic()
    view = CatalogView(WatchLimits(max_tools=nodes * tools))
    seq = 0
    for n in range(nodes):
        node, (module, split) = f"n{n:04}", lists[n % modules]
        entries = [(defs_key(node, module, "tools", split.digest, i), p) for i, p in enumerate(split.parts)]
        entries.append((state_key(node, module, "tools"), encode(
            StateRecord(module, "tools", "1.0.0", "ready", split.digest, len(split.parts), split.tools))))
        entries.append((node_key(node), encode(NodeRecord(node, "r", "svc", 5.0, 15.0, 0.0, bundles=[f"{module}/tools"]))))
        entries.append((beat_key(node), encode(BeatRecord("r"))))
        for key, value in entries:
            seq += 1
            view.apply(Entry(key, seq, bytes(value)))  # a copy, as each would arrive off the wire
    view.take_change()
    elapsed = time.monotonic() - started
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = len(view.tools())
    return {"nodes": nodes, "tools": held, "modules": modules, "held_mb": round(current / 2**20, 1),
            "peak_mb": round(peak / 2**20, 1), "bytes_per_tool": round(current / held), "build_s": round(elapsed, 2),
            "values_held_mb": round(view.stats.bytes / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10,30,60", help="mesh sizes, comma separated")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle measure")
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--no-memory", action="store_true", help="leave out the reader's memory for 100,000 tools")
    args = parser.parse_args(argv)
    rows = []
    for count in [int(n) for n in args.nodes.split(",")]:
        print(f"catalog: {count} nodes ...", file=sys.stderr, flush=True)
        rows.append(asyncio.run(measure(count, args.idle, args.restarts)))
    print(f"\n{'nodes':>5} {'tools':>6} {'first read':>18} {'idle':>15} {'per change':>11} {'less beats':>11} "
          f"{'seen after':>11} {'INFO look':>22} {'look/change':>11}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['tools']:>6} {r['first_read_bytes']:>9} B {r['first_read_ms']:>5} ms "
              f"{r['idle_bytes_per_s']:>5} B/s ({r['bytes_per_beat']} B a beat) "
              f"{statistics.median(r['bytes_per_change']):>9} B "
              f"{r['bytes_per_change_net_median']:>9} B "
              f"{statistics.median(r['change_seen_ms']):>8} ms {r['info_look_bytes']:>10} B {r['info_look_ms']:>6} ms "
              f"{r['look_over_change']:>10}x")
    memory = []
    if not args.no_memory:
        memory = [reader_memory(2000, 50, 2000), reader_memory(1000, 100, 10)]
        print("\nreader memory (tracemalloc):")
        for m in memory:
            print(f"  {m['tools']} tools on {m['nodes']} nodes from {m['modules']} modules: {m['held_mb']} MB held "
                  f"({m['bytes_per_tool']} B a tool; values {m['values_held_mb']} MB), peak {m['peak_mb']} MB, "
                  f"built in {m['build_s']} s")
    if args.json:
        args.json.write_text(json.dumps({"mesh": rows, "memory": memory}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
