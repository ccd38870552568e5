"""`meshctl console` run: the bus connection (the console delegate's), the catalogue followed, the login
(local or OpenID Connect), and the pages served by uvicorn until SIGINT or SIGTERM.

Secure by default: without `--auth-issuer` the console listens on loopback only and logs in the OS
user who started it, with the link it prints; another host is refused unless people log in through an
issuer. Logs and the login link go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import anyio
import uvicorn

from runtime.bus.catalog import CatalogUnavailable
from runtime.bus.connect import BusError, connect
from runtime.meshctl.console.app import Console, ConsoleSettings
from runtime.meshctl.console.auth import LocalLogin, OidcLogin
from runtime.meshctl.console.reads import MeshReads
from runtime.meshctl.errors import MeshError
from runtime.meshctl.settings import login
from runtime.wire.identity import os_person

log = logging.getLogger("mesh.console")
CLIENT_NAME = "meshctl-console"


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise MeshError(f"--http {text!r}: give HOST:PORT, e.g. 127.0.0.1:8780")
    return host.strip("[]") or "127.0.0.1", int(port)


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it
    # a page's body waited for the client's delayed ACK of its headers (40 ms a page).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise MeshError(f"--http {host}:{port}: cannot listen there ({e.strerror})") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _hosts(host: str, port: int, public: str) -> set[str]:
    names = {f"{host}:{port}", urlsplit(public).netloc.lower()}
    if loopback(host):
        names |= {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    return names


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the console's task group owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_console(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    host, port = address(args.http)
    if bool(args.auth_issuer) != bool(args.auth_client_id):
        raise MeshError(
            "--auth-issuer and --auth-client-id go together: the issuer's URL and the console's client id there"
        )
    if not loopback(host) and not args.auth_issuer:
        raise MeshError(
            f"--http {host}: without --auth-issuer the console logs in the OS user who started it and so listens "
            "on loopback only (e.g. --http 127.0.0.1:8780); to serve the network, log people in through an OpenID "
            "Connect issuer (--auth-issuer URL --auth-client-id ID)"
        )
    secret = None
    if args.auth_client_secret_file:
        try:
            secret = Path(args.auth_client_secret_file).read_text().strip()
        except OSError as e:
            raise MeshError(f"--auth-client-secret-file: cannot read it ({e.strerror})") from None
    found = login(args, "console")
    sock = _bound(host, port)
    port = sock.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host else host
    public = (args.public_url or f"http://{shown_host}:{port}").rstrip("/")
    if urlsplit(public).scheme not in ("http", "https"):
        raise MeshError(f"--public-url {public!r}: give the http:// or https:// URL people open")
    settings = ConsoleSettings(
        hosts=_hosts(shown_host, port, public),
        secure_cookie=public.startswith("https://"),
        session_ttl_s=args.session_s,
    )

    async def run() -> int:
        try:
            nc = await connect(found.cfg, CLIENT_NAME, quiet=True)
        except BusError as e:
            raise MeshError(str(e)) from None
        oidc = local = None
        try:
            if args.auth_issuer:
                oidc = OidcLogin(args.auth_issuer, args.auth_client_id, secret, public + "/auth/callback")
                await oidc.discover()
            else:
                local = LocalLogin(os_person())
            reads = MeshReads(nc)
            console = Console(reads, settings, local, oidc)
            config = uvicorn.Config(
                console.app(), log_level="warning", access_log=False, lifespan="off", proxy_headers=False
            )
            server = _Uvicorn(config)
            async with anyio.create_task_group() as tg:
                try:
                    await tg.start(reads.catalog.run)
                except CatalogUnavailable as e:
                    reads.catalog_problem = f"the catalogue cannot be read: {e}"
                    log.error("console: %s; the mesh page lists no node", reads.catalog_problem)

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            server.should_exit = True
                            return

                tg.start_soon(stop_on_signal)
                if not found.delegate:
                    log.warning(
                        "console: these bus credentials are not known to be a delegate's; a node refuses the "
                        'person behind each call unless its [identity] delegates lists them as "console"'
                    )
                how = (
                    f"log in through {oidc.issuer}"
                    if oidc
                    else f"log in: {public}/login?token={local.token if local else ''}"
                )
                print(f"console: {public}/ ({how})", file=sys.stderr, flush=True)
                await server.serve(sockets=[sock])
                tg.cancel_scope.cancel()
            return 0
        finally:
            with anyio.CancelScope(shield=True):
                await nc.close()
            sock.close()

    return anyio.run(run)
