"""`meshctl caller add | remove | list`: who may use the embedded bus besides the node's own user.

The node that runs the bus changes its accounts (runtime/node/callers.py); this asks it, as the
node's OS user (the mesh account). `add` writes the caller file that is handed to the caller: the
bus's URL, the user and its password, mode 0600 (`--owner USER` makes it that user's, as root).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import anyio
import msgspec

from runtime.meshctl.errors import MeshError, Refused
from runtime.meshctl.settings import CallerFile, client_config
from runtime.meshctl.verbs.shared import checked_node, table
from runtime.wire.control import CallersAsk, CallersReply
from runtime.wire.subjects import CALLERS, node_subject


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    caller = verbs.add_parser("caller", help="callers of the embedded bus: add, remove, list")
    sub = caller.add_subparsers(dest="caller_verb", required=True)
    common = argparse.ArgumentParser(add_help=False, parents=[bus])
    common.add_argument("--name", help="the node that runs the bus (default: the local node)")
    common.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for the node")

    add = sub.add_parser("add", help="a caller of its own account; writes its caller file", parents=[common])
    add.add_argument("user", help="the caller's user (letters, digits, - and _)")
    add.add_argument("--account", help="its account (default: the same as the user)")
    add.add_argument(
        "--delegate",
        choices=["mcp", "console"],
        help="a delegate: it may pass the person behind each call (an MCP face, a web console)",
    )
    add.add_argument("--out", metavar="FILE", help="where to write the caller file (default ./<user>.caller.json)")
    add.add_argument("--owner", metavar="USER", help="make the caller file this OS user's (needs root)")
    add.set_defaults(func=cmd_caller_add)

    remove = sub.add_parser("remove", help="a caller `caller add` made: it can no longer log in", parents=[common])
    remove.add_argument("user")
    remove.set_defaults(func=cmd_caller_remove)

    listing = sub.add_parser(
        "list", help="every user of the embedded bus and what the node marks its calls", parents=[common]
    )
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_caller_list)


def _ask(args: argparse.Namespace, ask: CallersAsk) -> tuple[CallersReply, str, str]:
    """The node's answer, the node's name and the bus's URL."""
    from runtime.meshctl.bus import request

    cfg, found = client_config(args)
    name = args.name or found
    if not name:
        raise MeshError("which node runs the bus? name it with --name NODE (the bus was given with --nats)")
    msg = anyio.run(request, cfg, node_subject(checked_node(name), CALLERS), msgspec.json.encode(ask), args.timeout)
    try:
        reply = msgspec.json.decode(msg.data, type=CallersReply)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Refused(f"node {name} answered what this meshctl cannot read ({e}); is it another version?") from None
    if not reply.ok:
        raise Refused(reply.error)
    return reply, name, cfg.url or ""


def cmd_caller_list(args: argparse.Namespace) -> int:
    reply, _, _ = _ask(args, CallersAsk(op="list"))
    if args.json:
        print(json.dumps([msgspec.to_builtins(r) for r in reply.callers], indent=2))
        return 0
    rows = [("ACCOUNT", "USER", "KIND", "VIA", "PASSWORD FILE")]
    rows += [(r.account, r.user, r.kind, r.via, r.password_file or "(in the config)") for r in reply.callers]
    table(rows)
    return 0


def cmd_caller_add(args: argparse.Namespace) -> int:
    out = Path(args.out or f"{args.user}.caller.json")
    if out.exists():
        raise MeshError(f"{out} exists; give another --out FILE (a caller file is never overwritten)")
    reply, node, url = _ask(
        args, CallersAsk(op="add", user=args.user, account=args.account or "", via=args.delegate or "")
    )
    row = reply.changed
    assert row is not None
    try:
        password = Path(row.password_file).read_text().strip()
    except OSError as e:
        raise MeshError(
            f"caller {row.user} was added but its password file {row.password_file} cannot be read: {e.strerror}"
        ) from None
    data = msgspec.json.encode(CallerFile(url=url, user=row.user, password=password, node=node, via=args.delegate))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data + b"\n")
    if args.owner:
        try:
            shutil.chown(out, args.owner)
        except (LookupError, PermissionError) as e:
            raise MeshError(
                f"caller {row.user} was added and {out} written, but it could not be made {args.owner}'s: {e}"
            ) from None
    kind = f"a delegate (via {row.via})" if args.delegate else "a caller"
    print(f"added {row.account}/{row.user} on node {node}'s bus: {kind}")
    print(f"caller file: {out} (mode 0600; it holds the password): hand it to the caller, who runs meshctl with")
    print(f"  --caller-file {out.name}, or keeps it at ~/.config/mesh-node/caller.json")
    return 0


def cmd_caller_remove(args: argparse.Namespace) -> int:
    reply, node, _ = _ask(args, CallersAsk(op="remove", user=args.user))
    row = reply.changed
    assert row is not None
    print(
        f"removed {row.account}/{row.user} from node {node}'s bus: it can no longer log in (its connections are closed)"
    )
    return 0
