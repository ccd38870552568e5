"""`meshctl mcp` run: the mesh as one MCP server, over stdio (default) or `--http HOST:PORT`.

`--list` prints what a client would see (name, subject, nodes) and what the patterns left out,
then exits. Logs go to stderr: stdout belongs to the MCP client on stdio.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import anyio

from runtime.bus.connect import BusError, connect
from runtime.meshctl.errors import MeshError
from runtime.meshctl.face.auth import HttpSettings, load_http_settings
from runtime.meshctl.face.catalog import Catalog, FaceError, FaceTool, load_selection
from runtime.meshctl.face.server import Face
from runtime.meshctl.face.state_key import state_keys
from runtime.meshctl.face.transports import http_security, serve_http, serve_stdio
from runtime.meshctl.face.workers import MAX_WORKERS, PARENT_ENV, die_with_parent
from runtime.meshctl.settings import login
from runtime.wire.identity import Person, os_user

CLIENT_NAME = "meshctl-mcp"
GC_YOUNG = 20_000  # allocations between collections of the youngest generation (Python's default: 700)  # the face's NATS connection name: what a node's caller stamp shows as name


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise MeshError(f"--http {text!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host or "127.0.0.1", int(port)


def http_settings(args: argparse.Namespace, address: tuple[str, int]) -> HttpSettings:
    """The HTTP face's auth and bounds: the face's config file's [auth] and [http], the flags over them."""
    return load_http_settings(
        address[0],
        address[1],
        Path(args.config) if args.config else None,
        issuer=args.auth_issuer,
        audience=args.auth_audience,
        scopes=args.auth_scope,
        allow_unauthenticated=args.allow_unauthenticated,
        resource=args.auth_resource,
    )


def os_person() -> Person:
    """The OS user running this face, as a person: issued by this machine (`unix:<host>`)."""
    user = os_user()
    return Person(iss=f"unix:{socket.gethostname()}", sub=user, name=user)


def event_loop_options() -> dict[str, bool]:
    """uvloop when it is installed: the face is a hop on every call, and its loop's costs are per call."""
    return {"use_uvloop": True} if importlib.util.find_spec("uvloop") is not None else {}


def settle_collector() -> None:
    """What was made at start (the mcp package's models, a hundred thousand objects) is frozen out
    of the cycle collector, and its youngest generation is collected less often: the face makes
    short-lived objects on every call, and each collection walked them all (perf: about 7 % of the
    face's CPU at 32 calls in flight)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 20)


def run_mcp(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.page_size < 1:
        raise MeshError(f"--page-size {args.page_size}: give a whole number of at least 1")
    address = _address(args.http) if args.http else None
    if not 1 <= args.workers <= MAX_WORKERS:
        raise MeshError(f"--workers {args.workers}: give a whole number from 1 to {MAX_WORKERS}")
    if args.workers > 1 and (address is None or address[1] == 0):
        raise MeshError("--workers needs --http HOST:PORT with a port of its own (the workers share it)")
    if args.worker > 0:
        die_with_parent()
        if os.getppid() != int(os.environ.get(PARENT_ENV, "0") or 0):
            return 0  # the face that started this worker is already gone
    try:
        selection = load_selection(
            Path(args.config) if args.config else None, args.profile, args.only, args.exclude, args.max_tools
        )
        settings = http_settings(args, address) if address is not None else None
        security = http_security(settings.host, args.allow_origin, settings.hosts) if settings is not None else None
    except FaceError as e:
        raise MeshError(str(e)) from None
    # Never the mesh account: the node's OS user gets the embedded bus's face user (a delegate).
    found = login(args, "face")
    cfg = found.cfg
    if settings is not None and settings.on and not (found.delegate or args.delegate):
        raise MeshError(
            "--auth-issuer: the face passes each token's person to the nodes, which believe it only from a "
            "delegate ([identity] mcp_faces); this login is not one: run as the node's OS user (the bus's face "
            "user), or give a delegate's credentials with --delegate"
        )
    # Over stdio the person behind every call is the OS user who started the face; only a
    # delegate may pass one (the node refuses it from anyone else).
    person = os_person() if address is None and (found.delegate or args.delegate) else None

    keys = state_keys(args.state_key, args.worker, args.workers)

    async def run() -> int:
        try:
            nc = await connect(cfg, CLIENT_NAME, quiet=True)
        except BusError as e:
            raise MeshError(str(e)) from None
        face = Face(nc, Catalog(selection), page_size=args.page_size, person=person, state_keys=keys)
        settle_collector()
        try:
            if args.list:
                await face.refresh()
                _print_list(face.catalog, args.json)
                return 0
            if address is not None and security is not None and settings is not None:
                # Stops on SIGINT/SIGTERM itself.
                await serve_http(
                    face,
                    address[0],
                    address[1],
                    security,
                    settings,
                    workers=args.workers,
                    worker=args.worker,
                    sessions_socket=args.sessions_socket,
                )
                return 0
            async with anyio.create_task_group() as tg:

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(stop_on_signal)
                await serve_stdio(face)  # until the client closes stdin
                tg.cancel_scope.cancel()
            return 0
        finally:
            with anyio.CancelScope(shield=True):
                await face.client.close()
                await nc.close()

    return anyio.run(run, backend_options=event_loop_options())


def _print_list(catalog: Catalog, as_json: bool) -> None:
    if as_json:
        print(json.dumps([_row(t) for t in catalog.tools], indent=2))
        return
    rows = [("NAME", "SUBJECT", "NODES")] + [(t.name, t.subject, _nodes(t)) for t in catalog.tools]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    hidden = f"; {len(catalog.left_out)} left out by the patterns" if catalog.left_out else ""
    print(f"{len(catalog.tools)} tools shown{hidden}")
    for t in catalog.left_out:
        print(f"  left out: {t.name} ({t.subject})", file=sys.stdout)


def _nodes(tool: FaceTool) -> str:
    return ",".join(f"{n}({s})" if s != "ready" else n for n, s in zip(tool.nodes, tool.states))


def _row(tool: FaceTool) -> dict[str, object]:
    return {"name": tool.name, "subject": tool.subject, "nodes": dict(zip(tool.nodes, tool.states)), **tool.definition}
