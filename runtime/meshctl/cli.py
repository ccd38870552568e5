"""`meshctl`: run a node, ask it for status, call tools, check and build modules.

Errors are rendered here, once: one line that says what was wrong and what would be right.
Exit codes: 0 ok, 1 a check or call failed, 2 bad usage or the bus could not be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError as JetStreamError

from manifests import ManifestError, load_module
from manifests.check import RUNTIME_IMAGES, check_path, third_party
from manifests.imported import LockError, read_lock
from runtime.bus.connect import BusError, connect
from runtime.bus.service_api import collect_infos
from runtime.config import ConfigError, NatsConfig, NodeConfig, finish, node_name_problem
from runtime.delivery.reconciler import DeliveryError
from runtime.hosting.placement import Placement, load_placements
from runtime.hosting.units import (
    NODE_UNIT,
    SYSTEM_STATE_DIR,
    UnitError,
    build_services,
    default_meshctl,
    node_unit,
    service_units,
    write_node_unit,
)
from runtime.meshctl.call import run_call
from runtime.meshctl.deliver import deliver, remove
from runtime.meshctl.imports import ImportFailed, SpecError, import_package
from runtime.meshctl.imports.core import SOURCE
from runtime.meshctl.mcp import add_parser as add_mcp_parser
from runtime.meshctl.seats import SeatAdminError, adopt, move, seat_rows
from runtime.meshctl.settings import CliError, bus_options, client_config, node_config
from runtime.meshctl.smoke import run_smoke
from runtime.node.node import Node
from toolchains.artifact import ArtifactError
from toolchains.base import BuildFailed, ToolchainMissing
from toolchains.build import BuildError, build_module, find_repo_root
from toolchains.packaged import offline
from toolchains.progress import BuildProgress

log = logging.getLogger("mesh.cli")
T = TypeVar("T")


# Why a node's own subjects ($SRV.*, mesh.node.*) go unanswered, when the bus itself answers.
NOT_MESH_ACCOUNT = "this connection is not in the mesh account (a caller account reaches the tool, seat, cancel and fetch subjects only)"


@contextlib.asynccontextmanager
async def _bus(cfg: NatsConfig) -> AsyncIterator[Client]:
    """A connection for one command, closed when it is done; no bus is one line, not a traceback."""
    try:
        nc = await connect(cfg, "meshctl", quiet=True)
    except BusError as e:
        raise CliError(str(e)) from None
    try:
        yield nc
    finally:
        await nc.close()


async def _request(cfg: NatsConfig, subject: str, body: bytes, timeout: float) -> Msg:
    async with _bus(cfg) as nc:
        try:
            return await nc.request(subject, body, timeout=timeout)
        except NoRespondersError:
            raise CliError(
                f"nobody on the bus serves {subject}: no node of that name runs on this bus, or {NOT_MESH_ACCOUNT}",
                code=1,
            ) from None
        except NatsTimeout:
            raise CliError(f"no answer on {subject} within {timeout:g} s", code=1) from None


# --- node run -------------------------------------------------------------------------
def _finished(config: NodeConfig) -> NodeConfig:
    try:
        return finish(config)
    except ConfigError as e:
        raise CliError(f"{e}; name the node with --name (or `name` in --config)") from None


def _checked_node(name: str) -> str:
    """A node name given to a verb: it becomes part of subjects and KV keys, so it must be a name."""
    if why := node_name_problem(name):
        raise CliError(why)
    return name


def cmd_node_run(args: argparse.Namespace) -> int:
    config = _finished(node_config(args))
    _setup_logging(args.log_level)
    node = Node(config)
    placements: list[Placement] = []
    if config.manifests:
        placements, problems = load_placements(Path(config.manifests))
        for problem in problems:
            log.error("module not loaded: %s", problem)
        node.problems.extend(problems)

    async def main() -> None:
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

    failed: list[BusError] = []
    anyio.run(main)
    if failed:
        raise CliError(str(failed[0]))
    return 0


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# --- node status / restart ---------------------------------------------------------------
def _node_name(args: argparse.Namespace, found: str | None) -> str:
    name = args.name or found
    if not name:
        raise CliError("which node? name it with --name NODE (the bus was given with --nats)")
    return _checked_node(name)


def _state_shown(bundle: dict[str, Any]) -> str:
    """The state, with how long it has lasted where that is news: a build, a start, a backoff."""
    since = bundle.get("state_for_s")
    if bundle["state"] in ("building", "starting", "backoff") and isinstance(since, (int, float)):
        return f"{bundle['state']} ({since:.0f} s)"
    return str(bundle["state"])


def cmd_node_status(args: argparse.Namespace) -> int:
    cfg, found = client_config(args)
    name = _node_name(args, found)
    msg = anyio.run(_request, cfg, f"mesh.node.{name}.status", b"", args.timeout)
    status = json.loads(msg.data)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(
        f"node {status['node']}  bus {status['url']}  pid {status['pid']}  up {status['uptime_s']:.0f} s  "
        f"calls answered {status['answered']}, in flight {status['in_flight']}"
    )
    # Tools and service bundles in one table: KIND says which, RUNS who supervises it (the node,
    # or systemd as a unit), LAST EXIT how its child last ended.
    rows = [
        ("BUNDLE", "KIND", "LANGUAGE", "RUNS", "STATE", "PID", "MCP", "RESTARTS", "TOOLS", "LAST EXIT", "LAST ERROR")
    ]
    for b in status["bundles"]:
        kind = b.get("kind", "tools")
        rows.append(
            (
                f"{b['module']}/{b['bundle']}",
                kind,
                b["language"],
                b.get("runs", "node"),
                _state_shown(b),
                str(b["pid"] or "-"),
                f"{b['protocol_version']} ({b.get('era')})" if b.get("protocol_version") else "-",
                str(b["restarts"]),
                str(len(b["tools"])) if kind == "tools" else "-",
                b["last_exit"] or "-",
                b["last_error"] or "",
            )
        )
    _table(rows)
    for s in status["seats"]:
        print(_seat_line(s))
    for p in status["problems"]:
        print(f"problem: {p}")
    return 0


def _seat_line(s: dict[str, Any]) -> str:
    if s["state"] == "held":
        return f"seat {s['seat']}: held by {s['module']}"
    if s["state"] == "elsewhere":
        holder = s.get("holder") or "?"
        line = f"seat {s['seat']}: held by node {holder}, not here (module {s['module']})"
        # The keeper's reason names the holder's module; shown only when it is not this one.
        same = f"node {holder} holds seat {s['seat']} (module {s['module']})"
        return line if s["reason"] in ("", same) else f"{line}: {s['reason']}"
    return f"seat {s['seat']}: {s['state']} for module {s['module']}" + (f": {s['reason']}" if s["reason"] else "")


def cmd_node_restart(args: argparse.Namespace) -> int:
    cfg, found = client_config(args)
    name = _node_name(args, found)
    msg = anyio.run(
        _request, cfg, f"mesh.node.{name}.restart", json.dumps({"bundle": args.bundle}).encode(), args.timeout
    )
    reply = json.loads(msg.data)
    if not reply.get("ok"):
        print(f"meshctl: {reply.get('error')}", file=sys.stderr)
        return 1
    print(f"restarting {reply['bundle']} on node {name} (was {reply['was']})")
    return 0


# --- node unit(s): systemd units (runtime/hosting/units.py) ---------------------------------------------
def cmd_node_unit(args: argparse.Namespace) -> int:
    """`meshctl node unit`: print mesh-node.service, or write it into --out."""
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
    config = node_config(args)
    if not config.manifests:
        raise CliError("which modules? name their folder with --manifests DIR (or `manifests` in --config)", code=1)
    state = config.state_dir or SYSTEM_STATE_DIR
    node = _finished(config).name  # the host name when none is given, as `node run` would pick
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


# --- call and tools -----------------------------------------------------------------------
def _subject(target: str) -> str:
    if target.startswith("mesh."):
        return target
    if target.startswith(("tool.", "seat.")) and target.count(".") >= 2:
        return "mesh." + target
    raise CliError(f"{target!r}: name a tool as tool.<module>.<tool> or a seat verb as seat.<seat>.<verb>")


def cmd_call(args: argparse.Namespace) -> int:
    subject = _subject(args.target)
    body = (args.arguments if args.arguments is not None else "{}").encode()
    if args.arguments == "-":
        body = sys.stdin.buffer.read()
    cfg, _ = client_config(args)

    async def call() -> int:
        async with _bus(cfg) as nc:
            return await run_call(nc, subject, body, args.timeout, args.json)

    return anyio.run(call)


async def _infos(cfg: NatsConfig, wait: float) -> list[dict[str, Any]]:
    async with _bus(cfg) as nc:
        return await collect_infos(nc, wait)


def cmd_tools(args: argparse.Namespace) -> int:
    cfg, _ = client_config(args)
    infos = anyio.run(_infos, cfg, args.wait)
    rows = [("SUBJECT", "KIND", "MODULE", "BUNDLE", "NODE")]
    seen: list[tuple[str, ...]] = []
    for info in infos:
        node = (info.get("metadata") or {}).get("node", info.get("id", "?"))
        for e in info.get("endpoints", []):
            meta = e.get("metadata") or {}
            seen.append((e["subject"], meta.get("kind", ""), meta.get("module", ""), meta.get("bundle", ""), node))
    if args.json:
        print(
            json.dumps([dict(zip(("subject", "kind", "module", "bundle", "node"), r)) for r in sorted(seen)], indent=2)
        )
        return 0
    _table(rows + sorted(seen))
    print(f"{len(seen)} tools on {len(infos)} node{'' if len(infos) == 1 else 's'}")
    if not infos:
        print(f"meshctl: no node answered $SRV.INFO: none runs on this bus, or {NOT_MESH_ACCOUNT}", file=sys.stderr)
    return 0


# --- module check, bundle build -----------------------------------------------------------
def cmd_module_check(args: argparse.Namespace) -> int:
    images = RUNTIME_IMAGES + tuple(args.runtime_image or ())
    failed = 0
    for path in args.paths:
        problems = check_path(path, images)
        for p in problems:
            print(p)
        if problems:
            failed += 1
        elif not args.quiet:
            print(f"{path}: ok")
            try:
                notes = third_party(load_module(path))[0]
            except ManifestError:
                notes = []
            for note in notes:
                print(f"{path}: {note}")
    return 1 if failed else 0


def cmd_module_import(args: argparse.Namespace) -> int:
    folder = import_package(
        args.spec,
        name=args.name,
        out=Path(args.out) if args.out else None,
        args=args.server_args,
        cache=Path(args.cache) if args.cache else None,
        offline=args.offline or offline(),
        log=lambda line: print(line, flush=True),
    )
    lock = read_lock(folder / SOURCE)
    print(f"{folder}: module of {lock.spec} ({len(lock.fetched)} locked files), entry {' '.join(lock.entry)}")
    print(f"next: meshctl module check {folder} && meshctl bundle build {folder} --out out")
    return 0


def cmd_bundle_build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with BuildProgress() as progress:  # a live line on a terminal, plain lines otherwise
        for module_dir in args.modules:
            build_module(Path(module_dir), out, progress=progress)
    return 0


def _member_node(args: argparse.Namespace) -> tuple[NatsConfig, str]:
    """The bus, and the node whose membership changes: --node, else the local one."""
    cfg, found = client_config(args)
    node = args.node or found
    if not node:
        raise CliError("which node? name it with --node NAME")
    return cfg, _checked_node(node)


def cmd_bundle_deliver(args: argparse.Namespace) -> int:
    cfg, node = _member_node(args)
    paths = [Path(a) for a in args.artifacts]
    for path in paths:
        if not path.is_file():
            raise CliError(f"{path}: no such artifact; build one with `meshctl bundle build MODULE_DIR --out DIR`")

    async def run() -> None:
        async with _bus(cfg) as nc:
            await deliver(nc, paths, node, args.seat, progress=lambda line: print(line, flush=True))

    anyio.run(run)
    return 0


def cmd_bundle_remove(args: argparse.Namespace) -> int:
    cfg, node = _member_node(args)

    async def run() -> None:
        async with _bus(cfg) as nc:
            membership = await remove(nc, args.modules, node)
        print(
            f"node {node}: removed {', '.join(args.modules)}; delivered modules left on it: "
            f"{', '.join(membership.modules) or 'none'}"
        )

    anyio.run(run)
    return 0


def cmd_seat_list(args: argparse.Namespace) -> int:
    cfg, _ = client_config(args)

    async def run() -> list[Any]:
        async with _bus(cfg) as nc:
            return await seat_rows(nc)

    rows = anyio.run(run)
    if args.json:
        print(json.dumps([msgspec.to_builtins(r) for r in rows], indent=2))
        return 0
    table = [("SEAT", "HOLDER", "MODULE", "HELD FOR", "DATA ON")]
    for r in rows:
        held_for = f"{time.time() - r.since:.0f} s" if r.holder else "-"
        table.append((r.seat, r.holder or "(free)", r.module, held_for, r.home or "(replicated or none)"))
    _table(table)
    return 0


def _seat_admin(args: argparse.Namespace, verb: Callable[[Client], Awaitable[T]]) -> T:
    """Run one seat admin verb on the bus; a refusal is the CLI's error (exit 1), said once at the edge."""
    cfg, _ = client_config(args)

    async def run() -> T:
        async with _bus(cfg) as nc:
            try:
                return await verb(nc)
            except SeatAdminError as e:
                raise CliError(str(e), code=1) from None

    return anyio.run(run)


def cmd_seat_adopt(args: argparse.Namespace) -> int:
    record, before = _seat_admin(args, lambda nc: adopt(nc, args.seat, args.node))
    print(
        f"seat {args.seat}: its data is node {record.node}'s now (was {before or 'none'}); node {record.node} "
        "takes the seat with whatever its data folder holds"
    )
    return 0


def cmd_seat_move(args: argparse.Namespace) -> int:
    reply = _seat_admin(args, lambda nc: move(nc, args.seat, args.to, args.timeout))
    print(f"seat {args.seat}: data moved from node {reply['from']} to node {reply['to']} ({reply['object']})")
    if not reply["held"]:
        print(
            f"node {args.to} does not hold the seat yet: it takes it (with the data) at its next start or look; "
            f"see `meshctl node status --name {args.to}`"
        )
        return 1
    print(f"node {args.to} holds seat {args.seat} now")
    return 0


def cmd_smoke(args: argparse.Namespace) -> int:
    bundles = Path(args.bundles) if args.bundles else None
    if bundles is None:
        root = find_repo_root(Path.cwd()) or find_repo_root(Path(__file__).resolve().parent)
        if root is None:
            raise CliError("where are the hello bundles? name the folder with --bundles DIR")
        bundles = root / "bundles"
    return run_smoke(bundles, args.timeout, args.keep)


# --- the parser -----------------------------------------------------------------------------
def seconds(text: str) -> float:
    """An argparse type: a time in seconds above 0 (0 or less would be a deadline already past)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 30 or 0.5") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} seconds: give a number above 0, e.g. 30 or 0.5")
    return value


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshctl", description="The mesh node tool runtime.")
    bus = bus_options()
    verbs = p.add_subparsers(dest="verb", required=True)

    node = verbs.add_parser("node", help="run a node, ask it for status, restart a bundle")
    node_verbs = node.add_subparsers(dest="node_verb", required=True)
    run = node_verbs.add_parser("run", help="run the node (on the embedded bus unless --nats is given)", parents=[bus])
    run.add_argument("--config", metavar="FILE", help="the node's TOML config file")
    run.add_argument("--manifests", metavar="DIR", help="serve every module folder under DIR, from source")
    run.add_argument("--name", help="the node's name (default: the host name)")
    run.add_argument("--embedded-port", type=int, help="port of the embedded NATS server (default 4222, or a free one)")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
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

    call = verbs.add_parser("call", help="call a tool: tool.<module>.<tool> or seat.<seat>.<verb>", parents=[bus])
    call.add_argument("target")
    call.add_argument("arguments", nargs="?", help="the arguments as a JSON object ('-' reads stdin)")
    call.add_argument("--json", action="store_true", help="print the CallToolResult as JSON")
    call.add_argument(
        "--timeout",
        type=seconds,
        default=60.0,
        help="seconds the call may take, its deadline on the node too (default 60)",
    )
    call.set_defaults(func=cmd_call)

    tools = verbs.add_parser("tools", help="every tool served on the bus (from $SRV.INFO)", parents=[bus])
    tools.add_argument("--json", action="store_true")
    tools.add_argument("--wait", type=seconds, default=0.5, help="how long to collect answers, seconds")
    tools.set_defaults(func=cmd_tools)

    add_mcp_parser(verbs, bus)

    module = verbs.add_parser("module", help="check module manifests")
    module_verbs = module.add_subparsers(dest="module_verb", required=True)
    check = module_verbs.add_parser("check", help="the registration check (record 0188)")
    check.add_argument("paths", nargs="+", metavar="PATH", help="a module folder or its module.toml")
    check.add_argument("--runtime-image", action="append", help="another repository of the runtime's own image")
    check.add_argument("--quiet", action="store_true", help="print problems only")
    check.set_defaults(func=cmd_module_check)
    imp = module_verbs.add_parser(
        "import",
        help="make a module of a published MCP server (npm, PyPI, crates.io, the Go module proxy), pinned by hash",
        description="SPEC: npm:<package>@<version>, pypi:<package>==<version>, cargo:<crate>@<version>, "
        "go:<package path>@<version>; no version: the newest, written into the lock. "
        "Arguments after -- are the server's own, appended to its entry.",
    )
    imp.add_argument("spec", metavar="SPEC", help="then, after --, the arguments the server is run with")
    imp.add_argument("--name", help="the module's name (default: from the package's name)")
    imp.add_argument("--out", help="the module folder to write (default ./<name>); must not exist or be empty")
    imp.add_argument(
        "--cache", help="the package cache (default $MESH_PACKAGE_CACHE, else beside the toolchains' cache)"
    )
    imp.add_argument(
        "--offline", action="store_true", help="use the package cache only, never the network (also MESH_OFFLINE=1)"
    )
    imp.set_defaults(func=cmd_module_import)

    bundle = verbs.add_parser("bundle", help="build bundles")
    bundle_verbs = bundle.add_subparsers(dest="bundle_verb", required=True)
    build = bundle_verbs.add_parser("build", help="build every bundle of a module into artifacts")
    build.add_argument("modules", nargs="+", metavar="MODULE_DIR")
    build.add_argument("--out", default="out", help="where the .tar.gz artifacts go (default ./out)")
    build.set_defaults(func=cmd_bundle_build)
    deliver = bundle_verbs.add_parser(
        "deliver", help="put artifacts on the bus and make a node a member of their modules", parents=[bus]
    )
    deliver.add_argument("artifacts", nargs="+", metavar="ARTIFACT")
    deliver.add_argument("--node", help="the node that runs them (default: the local one)")
    deliver.add_argument(
        "--seat", action="append", help="hold only these seats (default: every seat the module declares)"
    )
    deliver.set_defaults(func=cmd_bundle_deliver)
    remove = bundle_verbs.add_parser(
        "remove", help="end a node's membership of modules: it stops their bundles", parents=[bus]
    )
    remove.add_argument("modules", nargs="+", metavar="MODULE")
    remove.add_argument("--node", help="the node (default: the local one)")
    remove.set_defaults(func=cmd_bundle_remove)
    seat = verbs.add_parser("seat", help="stateful seats: who holds each, where its data lives")
    seat_verbs = seat.add_subparsers(dest="seat_verb", required=True)
    seat_list = seat_verbs.add_parser("list", help="every seat with a lease or a home", parents=[bus])
    seat_list.add_argument("--json", action="store_true")
    seat_list.set_defaults(func=cmd_seat_list)
    seat_adopt = seat_verbs.add_parser(
        "adopt", help="say that NODE holds a disk-backed seat's data now (copied, or gone for good)", parents=[bus]
    )
    seat_adopt.add_argument("seat")
    seat_adopt.add_argument("--node", required=True, help="the node that takes the seat with its own data folder")
    seat_adopt.set_defaults(func=cmd_seat_adopt)
    seat_move = seat_verbs.add_parser("move", help="move a disk-backed seat and its data to NODE", parents=[bus])
    seat_move.add_argument("seat")
    seat_move.add_argument("--to", required=True, metavar="NODE")
    seat_move.add_argument(
        "--timeout", type=seconds, default=60.0, help="seconds for the move and for NODE to take the seat"
    )
    seat_move.set_defaults(func=cmd_seat_move)
    smoke = verbs.add_parser(
        "smoke", help="build, deliver and call every hello-<language> bundle on a fresh local node"
    )
    smoke.add_argument(
        "--bundles", metavar="DIR", help="where the hello-* modules are (default: this checkout's bundles/)"
    )
    smoke.add_argument("--timeout", type=seconds, default=180.0, help="seconds for every tool to answer")
    smoke.add_argument("--keep", action="store_true", help="keep the work folder (artifacts, node state and log)")
    smoke.set_defaults(func=cmd_smoke)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `module import SPEC -- ARGS`: argparse's subparsers lose what follows `--`, so it is cut off here.
    server_args: list[str] = []
    if argv[:2] == ["module", "import"] and "--" in argv:
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1 :]
    args = parser().parse_args(argv)
    args.server_args = server_args
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a reader gone away is caught below, not at exit
        return code
    except BrokenPipeError:
        # The reader left (`meshctl call ... | head`): nothing more to tell it, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a program ended by SIGPIPE
    except CliError as e:
        print(f"meshctl: {e}", file=sys.stderr)
        return e.code
    except ManifestError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return 1
    except (UnitError, DeliveryError, ToolchainMissing, BuildFailed, BuildError, ArtifactError) as e:
        print(f"meshctl: {e}", file=sys.stderr)
        return 1
    except (ImportFailed, SpecError, LockError) as e:
        print(f"meshctl: {e}", file=sys.stderr)
        return 1
    except JetStreamError as e:
        print(f"meshctl: {jetstream_refusal(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def jetstream_refusal(e: JetStreamError) -> str:
    """A JetStream API error as one line: what the server said, and who may use the buckets."""
    said = e.description or type(e).__name__
    return (
        f"the bus refused a JetStream request: {said} (code {e.code}, error {e.err_code}); the buckets "
        "(delivery, seat leases and homes) are the mesh account's: run this as the node's user "
        "(it finds bus-mesh.password beside bus.json) or with the mesh account's --user/--password or --creds"
    )


if __name__ == "__main__":
    sys.exit(main())
