"""`meshctl seat list | adopt | move`: stateful seats, who holds each, where its data lives."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Awaitable, Callable, TypeVar

import anyio
import msgspec

from runtime.meshctl.settings import client_config
from runtime.meshctl.verbs.shared import seconds, table

if TYPE_CHECKING:
    from nats.aio.client import Client

T = TypeVar("T")


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
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
    seat_restore = seat_verbs.add_parser(
        "restore",
        help="restore a replicated seat's store from its replica onto NODE, which then holds it",
        parents=[bus],
    )
    seat_restore.add_argument("seat")
    seat_restore.add_argument("--node", required=True, help="the node that restores the store and holds the seat")
    seat_restore.add_argument("--at", default="", metavar="TIME", help="a point in time (RFC 3339), else the newest")
    seat_restore.set_defaults(func=cmd_seat_restore)


def _on_bus(args: argparse.Namespace, verb: Callable[[Client], Awaitable[T]]) -> T:
    """Run one seat verb on the bus; a refusal is a MeshError (exit 1), said once at the edge."""
    from runtime.meshctl.bus import bus

    cfg, _ = client_config(args)

    async def run() -> T:
        async with bus(cfg) as nc:
            return await verb(nc)

    return anyio.run(run)


def cmd_seat_list(args: argparse.Namespace) -> int:
    from runtime.meshctl.seats import seat_rows

    rows = _on_bus(args, seat_rows)
    if args.json:
        print(json.dumps([msgspec.to_builtins(r) for r in rows], indent=2))
        return 0
    lines = [("SEAT", "HOLDER", "MODULE", "HELD FOR", "DATA ON", "STORE", "LAST SYNC", "LAG")]
    for r in rows:
        held_for = f"{time.time() - r.since:.0f} s" if r.holder else "-"
        data_on = f"replica ({r.home})" if r.replica else (r.home or "(none)")
        synced = f"{time.time() - r.last_sync:.1f} s ago" if r.last_sync else "-"
        lag = f"{r.lag_s:.1f} s" if r.replica and r.holder else "-"
        lines.append((r.seat, r.holder or "(free)", r.module, held_for, data_on, r.store or "-", synced, lag))
    table(lines)
    return 0


def cmd_seat_adopt(args: argparse.Namespace) -> int:
    from runtime.meshctl.seats import adopt

    record, before = _on_bus(args, lambda nc: adopt(nc, args.seat, args.node))
    print(
        f"seat {args.seat}: its data is node {record.node}'s now (was {before or 'none'}); node {record.node} "
        "takes the seat with whatever its data folder holds"
    )
    return 0


def cmd_seat_move(args: argparse.Namespace) -> int:
    from runtime.meshctl.seats import move

    reply, held = _on_bus(args, lambda nc: move(nc, args.seat, args.to, args.timeout))
    print(f"seat {args.seat}: data moved from node {reply.from_node} to node {reply.to} ({reply.object})")
    if not held:
        print(
            f"node {args.to} does not hold the seat yet: it takes it (with the data) at its next start or look; "
            f"see `meshctl node status --name {args.to}`"
        )
        return 1
    print(f"node {args.to} holds seat {args.seat} now")
    return 0


def cmd_seat_restore(args: argparse.Namespace) -> int:
    from runtime.meshctl.seats import restore

    record = _on_bus(args, lambda nc: restore(nc, args.seat, args.node, args.at))
    print(
        f"seat {args.seat}: node {record.node} restores store {record.store} from its replica"
        f"{' at ' + args.at if args.at else ''} and then holds the seat (see `meshctl seat list`)"
    )
    return 0
