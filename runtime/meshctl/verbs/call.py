"""`meshctl call` and `meshctl tools`: a tool called over the bus; every tool the nodes serve."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from runtime.config import NatsConfig
from runtime.meshctl.errors import MeshError, Refused
from runtime.meshctl.settings import client_config
from runtime.meshctl.verbs.shared import seconds, table


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
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
    call.add_argument(
        "--answers",
        metavar="FILE",
        help="answer the tool's asks from FILE (a JSON list, in order); on a terminal they are asked for anyway",
    )
    call.add_argument(
        "--detach", action="store_true", help="a detached call: print its task at once; `meshctl task` reads it later"
    )
    call.add_argument("--wait", type=seconds, default=0.0, help="with --detach: wait this long for its end")
    call.set_defaults(func=cmd_call)

    task = verbs.add_parser("task", help="your detached calls: get, result, list, cancel", parents=[bus])
    task.add_argument("action", choices=("get", "result", "list", "cancel"))
    task.add_argument("task", nargs="?", help="the task id (meshctl call --detach printed it)")
    task.add_argument("--wait", type=seconds, default=60.0, help="result: seconds to wait for its end (default 60)")
    task.set_defaults(func=cmd_task)

    tools = verbs.add_parser("tools", help="every tool served on the bus (from the catalogue)", parents=[bus])
    tools.add_argument("--json", action="store_true")
    tools.add_argument(
        "--info",
        action="store_true",
        help="ask every node's $SRV.INFO instead of reading the catalogue (nodes older than the catalogue)",
    )
    tools.add_argument("--wait", type=seconds, default=0.5, help="with --info: how long to collect answers, seconds")
    tools.set_defaults(func=cmd_tools)


def subject_of(target: str) -> str:
    if target.startswith("mesh."):
        return target
    if target.startswith(("tool.", "seat.")) and target.count(".") >= 2:
        return "mesh." + target
    raise MeshError(f"{target!r}: name a tool as tool.<module>.<tool> or a seat verb as seat.<seat>.<verb>")


def cmd_call(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import bus
    from runtime.meshctl.call import Answers, run_call, run_detached

    subject = subject_of(args.target)
    body = (args.arguments if args.arguments is not None else "{}").encode()
    if args.arguments == "-":
        body = sys.stdin.buffer.read()
    cfg, _ = client_config(args, "caller")  # the node's own user calls as the operator's caller, not the mesh account
    answers = None
    if args.answers:
        answers = Answers.from_file(args.answers, sys.stderr)
    elif sys.stdin.isatty() and args.arguments != "-":
        answers = Answers(None, sys.stderr)  # asked on the terminal

    async def call() -> int:
        async with bus(cfg) as nc:
            if args.detach:
                return await run_detached(nc, subject, body, args.timeout, args.wait)
            return await run_call(nc, subject, body, args.timeout, args.json, answers)

    return anyio.run(call)


def cmd_task(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import bus
    from runtime.meshctl.call import run_task

    cfg, _ = client_config(args, "caller")

    async def run() -> int:
        async with bus(cfg) as nc:
            return await run_task(nc, args.action, args.task, args.wait)

    return anyio.run(run)


COLUMNS = ("subject", "kind", "module", "bundle", "node", "cluster", "state")


async def _from_catalog(cfg: NatsConfig) -> tuple[list[tuple[str, ...]], int, str]:
    """(rows, nodes, why there is no catalogue): one whole read of the bucket, no window."""
    from runtime.bus.catalog_watch import read_catalog
    from runtime.meshctl.bus import bus

    async with bus(cfg) as nc:
        catalog = await read_catalog(nc)
    rows: list[tuple[str, ...]] = [
        (t.subject, t.kind, t.module, t.bundle, t.node, t.cluster, t.state) for t in catalog.tools()
    ]
    return rows, len(catalog.nodes()), catalog.absent


async def _infos(cfg: NatsConfig, wait: float) -> list[dict[str, Any]]:
    from runtime.bus.service_api import collect_infos
    from runtime.meshctl.bus import bus

    async with bus(cfg) as nc:
        return await collect_infos(nc, wait)


async def _from_info(cfg: NatsConfig, wait: float) -> tuple[list[tuple[str, ...]], int, str]:
    """(rows, nodes, why none answered): every node's $SRV.INFO within `wait` seconds."""
    from runtime.meshctl.bus import NOT_MESH_ACCOUNT

    found = await _infos(cfg, wait)
    rows: list[tuple[str, ...]] = []
    for info in found:
        node = (info.get("metadata") or {}).get("node", info.get("id", "?"))
        for e in info.get("endpoints", []):
            m = e.get("metadata") or {}
            rows.append(
                (
                    e["subject"],
                    m.get("kind", ""),
                    m.get("module", ""),
                    m.get("bundle", ""),
                    node,
                    "",
                    m.get("state", ""),
                )
            )
    absent = "" if found else f"no node answered $SRV.INFO: none runs on this bus, or {NOT_MESH_ACCOUNT}"
    return rows, len(found), absent


def cmd_tools(args: argparse.Namespace) -> int:
    from runtime.bus.catalog import CatalogUnavailable

    cfg, _ = client_config(args)
    try:
        rows, nodes, absent = anyio.run(_from_info, cfg, args.wait) if args.info else anyio.run(_from_catalog, cfg)
    except CatalogUnavailable as e:
        raise Refused(f"{e}; `meshctl tools --info` asks the nodes' $SRV.INFO instead") from None
    rows.sort()
    if args.json:
        print(json.dumps([dict(zip(COLUMNS, r)) for r in rows], indent=2))
        return 0
    table([tuple(c.upper() for c in COLUMNS)] + [tuple(v or "-" for v in r) for r in rows])
    print(f"{len(rows)} tools on {nodes} node{'' if nodes == 1 else 's'}")
    if absent:
        hint = "" if args.info else "; `meshctl tools --info` asks the nodes' $SRV.INFO instead"
        print(f"meshctl: {absent}{hint}", file=sys.stderr)
    return 0
