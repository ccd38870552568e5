"""`meshctl node run | status | restart | unit | units`.

The verb modules import what a verb uses when it runs (inside its function): `node status` pays
for the bus and the status types, never for the node, the toolchains or the face.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from runtime.config import SYSTEM_STATE_DIR
from runtime.meshctl.errors import MeshError, Refused
from runtime.meshctl.settings import client_config, node_config
from runtime.meshctl.verbs.shared import checked_node, finished, seconds, table
from runtime.wire.control import NodeStatus, RestartAsk, RestartReply, SeatStatus
from runtime.wire.subjects import RESTART, STATUS, node_subject

if TYPE_CHECKING:
    from runtime.bus.connect import BusError

log = logging.getLogger("mesh.cli")


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    node = verbs.add_parser("node", help="run a node, ask it for status, restart a bundle")
    node_verbs = node.add_subparsers(dest="node_verb", required=True)
    run = node_verbs.add_parser("run", help="run the node (on the embedded bus unless --nats is given)", parents=[bus])
    run.add_argument("--config", metavar="FILE", help="the node's TOML config file")
    run.add_argument("--manifests", metavar="DIR", help="serve every module folder under DIR, from source")
    run.add_argument("--name", help="the node's name (default: the host name)")
    run.add_argument("--embedded-port", type=int, help="port of the embedded NATS server (default 4222, or a free one)")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="json: one object a line, with trace ids"
    )
    run.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics ([metrics] listen)"
    )
    run.set_defaults(func=cmd_node_run)

    status = node_verbs.add_parser(
        "status",
        help="tools and service bundles: kind, who runs them, state, pid, restarts, last exit and error",
        parents=[bus],
    )
    status.add_argument("--json", action="store_true")
    status.add_argument("--name", help="the node (default: the local one)")
    status.add_argument("--timeout", type=seconds, default=5.0)
    status.set_defaults(func=cmd_node_status)

    restart = node_verbs.add_parser("restart", help="restart a bundle (and bring back a failed one)", parents=[bus])
    restart.add_argument("bundle", help="module/bundle, or the module when it has one tools bundle")
    restart.add_argument("--name", help="the node (default: the local one)")
    restart.add_argument("--timeout", type=seconds, default=5.0)
    restart.set_defaults(func=cmd_node_restart)

    unit = node_verbs.add_parser("unit", help="the node's own systemd unit (mesh-node.service)")
    unit.add_argument("--config", metavar="FILE", help="the node's TOML config file, passed on to `node run`")
    unit.add_argument("--manifests", metavar="DIR", help="serve every module folder under DIR, from source")
    unit.add_argument("--name", help="the node's name (default: from --config, else the host name at run time)")
    unit.add_argument(
        "--state-dir", metavar="DIR", help=f"the node's state folder (default: from --config, else {SYSTEM_STATE_DIR})"
    )
    unit.add_argument("--user", help="run the node as this user (default root)")
    unit.add_argument("--meshctl", metavar="PATH", help="the meshctl to run (default: this one)")
    unit.add_argument(
        "--out", metavar="DIR", help="write DIR/mesh-node.service (e.g. /etc/systemd/system) instead of printing it"
    )
    unit.set_defaults(func=cmd_node_unit)

    units = node_verbs.add_parser("units", help="a systemd unit per bundle of kind service (record 0188)")
    units.add_argument("--out", metavar="DIR", required=True, help="where the mesh-<module>-<bundle>.service files go")
    units.add_argument("--manifests", metavar="DIR", help="the module folders (default: `manifests` of --config)")
    units.add_argument("--config", metavar="FILE", help="the node's TOML config file (name, state_dir, manifests)")
    units.add_argument("--name", help="the node's name, given to services as MESH_NODE (default: the host name)")
    units.add_argument(
        "--state-dir", metavar="DIR", help=f"the node's state folder (default: from --config, else {SYSTEM_STATE_DIR})"
    )
    units.add_argument("--user", help="run the services as this user (default root)")
    units.set_defaults(func=cmd_node_units)


# --- node run -------------------------------------------------------------------------
def cmd_node_run(args: argparse.Namespace) -> int:
    from runtime.hosting.placement import Placement, load_placements
    from runtime.node.logs import setup_logging
    from runtime.node.node import Node, prepare_process

    config = finished(node_config(args))
    setup_logging(args.log_level, args.log_format)
    node = Node(config)
    placements: list[Placement] = []
    if config.manifests:
        placements, problems = load_placements(Path(config.manifests))
        for problem in problems:
            log.error("module not loaded: %s", problem)
        node.problems.extend(problems)
    failed: list[BusError] = []

    async def main() -> None:
        from runtime.bus.connect import BusError

        prepare_process()  # in the loop: the pidfd child watcher attaches to it
        async with anyio.create_task_group() as tg:

            async def signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                    count = 0
                    async for sig in received:
                        count += 1
                        if count == 1:
                            log.info("got %s: stopping gracefully (again to stop at once)", signal.Signals(sig).name)
                            node.request_stop()
                        else:
                            tg.cancel_scope.cancel()

            async def announce() -> None:
                await node.wait_ready()
                print(f"mesh node {config.name} on {node.url}", file=sys.stderr, flush=True)

            tg.start_soon(signals)
            tg.start_soon(announce)
            try:
                await node.run(placements)
            except BusError as e:
                # Caught here, inside the task group: past it, it would come out wrapped in an
                # ExceptionGroup and print as a traceback instead of one line.
                failed.append(e)
            tg.cancel_scope.cancel()

    anyio.run(main)
    if failed:
        raise MeshError(str(failed[0]))
    return 0


# --- node status / restart ---------------------------------------------------------------
def _node_name(args: argparse.Namespace, found: str | None) -> str:
    name = args.name or found
    if not name:
        raise MeshError("which node? name it with --name NODE (the bus was given with --nats)")
    return checked_node(name)


def _state_shown(state: str, since: float) -> str:
    """The state, with how long it has lasted where that is news: a build, a start, a backoff."""
    if state in ("building", "starting", "backoff"):
        return f"{state} ({since:.0f} s)"
    return state


def cmd_node_status(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import request

    cfg, found = client_config(args)
    name = _node_name(args, found)
    msg = anyio.run(request, cfg, node_subject(name, STATUS), b"", args.timeout)
    if args.json:
        print(json.dumps(json.loads(msg.data), indent=2))
        return 0
    try:
        status = msgspec.json.decode(msg.data, type=NodeStatus)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Refused(f"node {name} answered a status this meshctl cannot read ({e}); is it another version?") from None
    cluster = f"  cluster {status.cluster}" if status.cluster else ""
    print(
        f"node {status.node}  bus {status.url}{cluster}  pid {status.pid}  up {status.uptime_s:.0f} s  "
        f"calls answered {status.answered}, in flight {status.in_flight}"
    )
    if status.identity:
        print(f"callers: {status.identity}")
    if status.sandbox:
        print(f"sandbox: {status.sandbox}")
    # Tools and service bundles in one table: KIND says which, RUNS who supervises it (the node,
    # or systemd as a unit), LAST EXIT how its child last ended.
    rows = [
        (
            "BUNDLE",
            "KIND",
            "LANGUAGE",
            "RUNS",
            "STATE",
            "PID",
            "MCP",
            "RESTARTS",
            "TOOLS",
            "CONFINEMENT",
            "LAST EXIT",
            "LAST ERROR",
        )
    ]
    for b in status.bundles:
        rows.append(
            (
                f"{b.module}/{b.bundle}",
                b.kind,
                b.language,
                b.runs,
                _state_shown(b.state, b.state_for_s),
                str(b.pid or "-"),
                f"{b.protocol_version} ({b.era})" if b.protocol_version else "-",
                str(b.restarts),
                str(len(b.tools)) if b.kind == "tools" else "-",
                b.confinement or "-",
                b.last_exit or "-",
                b.last_error or "",
            )
        )
    table(rows)
    for s in status.seats:
        print(seat_line(s))
    for p in status.problems:
        print(f"problem: {p}")
    return 0


def seat_line(s: SeatStatus) -> str:
    if s.state == "held":
        return f"seat {s.seat}: held by {s.module}"
    if s.state == "elsewhere":
        holder = s.holder or "?"
        line = f"seat {s.seat}: held by node {holder}, not here (module {s.module})"
        # The keeper's reason names the holder's module; shown only when it is not this one.
        same = f"node {holder} holds seat {s.seat} (module {s.module})"
        return line if s.reason in ("", same) else f"{line}: {s.reason}"
    return f"seat {s.seat}: {s.state} for module {s.module}" + (f": {s.reason}" if s.reason else "")


def cmd_node_restart(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import request

    cfg, found = client_config(args)
    name = _node_name(args, found)
    ask = msgspec.json.encode(RestartAsk(bundle=args.bundle))
    msg = anyio.run(request, cfg, node_subject(name, RESTART), ask, args.timeout)
    reply = msgspec.json.decode(msg.data, type=RestartReply)
    if not reply.ok:
        raise Refused(reply.error)
    print(f"restarting {reply.bundle} on node {name} (was {reply.was})")
    return 0


# --- node unit(s): systemd units (runtime/hosting/units.py) --------------------------------
def cmd_node_unit(args: argparse.Namespace) -> int:
    """`meshctl node unit`: print mesh-node.service, or write it into --out."""
    from runtime.hosting.units import NODE_UNIT, default_meshctl, node_unit, write_node_unit

    config = node_config(args)
    text = node_unit(
        meshctl=os.path.abspath(args.meshctl) if args.meshctl else default_meshctl(),
        config=args.config,
        name=config.name or None,  # none: the host name, picked when the unit runs
        state_dir=config.state_dir or SYSTEM_STATE_DIR,
        user=args.user,
        # A manifests folder the config file already names is not repeated on the command line.
        manifests=args.manifests,
    )
    if args.out:
        path = write_node_unit(args.out, text)
        print(f"wrote {path}; enable it with: systemctl daemon-reload && systemctl enable --now {NODE_UNIT}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_node_units(args: argparse.Namespace) -> int:
    """`meshctl node units`: a unit per service bundle of the modules under --manifests."""
    from runtime.hosting.placement import load_placements
    from runtime.hosting.units import build_services, service_units

    config = node_config(args)
    if not config.manifests:
        raise Refused("which modules? name their folder with --manifests DIR (or `manifests` in --config)")
    state = config.state_dir or SYSTEM_STATE_DIR
    node = finished(config).name  # the host name when none is given, as `node run` would pick
    placements, problems = load_placements(Path(config.manifests))
    for problem in problems:
        print(f"meshctl: module not loaded: {problem}", file=sys.stderr)

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    built = [build_services(p, state, say, config.build_cache) for p in placements]
    paths = service_units(built, node=node, state_dir=state, out_dir=args.out, user=args.user)
    for path in paths:
        print(f"wrote {path}")
    if paths:
        names = " ".join(p.name for p in paths)
        print(f"enable them with: systemctl daemon-reload && systemctl enable --now {names}")
    else:
        print(f"no bundle of kind service under {config.manifests}: no unit written")
    return 1 if problems else 0
