"""`meshctl call` and `meshctl tools`: a tool called over the bus; every tool the nodes serve."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from runtime.config import NatsConfig
from runtime.meshctl.errors import MeshError
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
    call.set_defaults(func=cmd_call)

    tools = verbs.add_parser("tools", help="every tool served on the bus (from $SRV.INFO)", parents=[bus])
    tools.add_argument("--json", action="store_true")
    tools.add_argument("--wait", type=seconds, default=0.5, help="how long to collect answers, seconds")
    tools.set_defaults(func=cmd_tools)


def subject_of(target: str) -> str:
    if target.startswith("mesh."):
        return target
    if target.startswith(("tool.", "seat.")) and target.count(".") >= 2:
        return "mesh." + target
    raise MeshError(f"{target!r}: name a tool as tool.<module>.<tool> or a seat verb as seat.<seat>.<verb>")


def cmd_call(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import bus
    from runtime.meshctl.call import run_call

    subject = subject_of(args.target)
    body = (args.arguments if args.arguments is not None else "{}").encode()
    if args.arguments == "-":
        body = sys.stdin.buffer.read()
    cfg, _ = client_config(args, "caller")  # the node's own user calls as the operator's caller, not the mesh account

    async def call() -> int:
        async with bus(cfg) as nc:
            return await run_call(nc, subject, body, args.timeout, args.json)

    return anyio.run(call)


async def _infos(cfg: NatsConfig, wait: float) -> list[dict[str, Any]]:
    from runtime.bus.service_api import collect_infos
    from runtime.meshctl.bus import bus

    async with bus(cfg) as nc:
        return await collect_infos(nc, wait)


def cmd_tools(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import NOT_MESH_ACCOUNT

    cfg, _ = client_config(args)
    found = anyio.run(_infos, cfg, args.wait)
    rows = [("SUBJECT", "KIND", "MODULE", "BUNDLE", "NODE")]
    seen: list[tuple[str, ...]] = []
    for info in found:
        node = (info.get("metadata") or {}).get("node", info.get("id", "?"))
        for e in info.get("endpoints", []):
            meta = e.get("metadata") or {}
            seen.append((e["subject"], meta.get("kind", ""), meta.get("module", ""), meta.get("bundle", ""), node))
    if args.json:
        print(
            json.dumps([dict(zip(("subject", "kind", "module", "bundle", "node"), r)) for r in sorted(seen)], indent=2)
        )
        return 0
    table(rows + sorted(seen))
    print(f"{len(seen)} tools on {len(found)} node{'' if len(found) == 1 else 's'}")
    if not found:
        print(f"meshctl: no node answered $SRV.INFO: none runs on this bus, or {NOT_MESH_ACCOUNT}", file=sys.stderr)
    return 0
