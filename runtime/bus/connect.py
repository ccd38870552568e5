"""Reaching the bus: connect options, credentials kept out of sight, and why a server refuses us."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import nats
from nats.aio.client import Client

from runtime.config import NatsConfig

log = logging.getLogger("mesh.bus")


class BusError(Exception):
    pass


def _each_url(urls: str, netloc: Any) -> str:
    out = []
    for url in urls.split(","):
        try:
            parts = urlsplit(url.strip())
        except ValueError:  # not a URL at all: show nothing of it that could be a secret
            out.append("<not a URL>")
            continue
        if "@" not in parts.netloc:
            out.append(url.strip())
            continue
        userinfo, host = parts.netloc.rsplit("@", 1)
        out.append(urlunsplit(parts._replace(netloc=netloc(userinfo, host))))
    return ",".join(out)


def redact(urls: str | None) -> str:
    """Bus URL(s) as logs, status and the banner show them: `nats://user:***@host`, `nats://***@host`
    (a token); a password or token in a URL is never shown."""
    return _each_url(urls or "", lambda u, h: (u.split(":", 1)[0] + ":***@" if ":" in u else "***@") + h)


def without_credentials(urls: str | None) -> str:
    """Bus URL(s) with no user, password or token: what bus.json keeps for meshctl."""
    return _each_url(urls or "", lambda u, h: h)


def connect_options(cfg: NatsConfig, name: str, persistent: bool = True) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "servers": [u.strip() for u in (cfg.url or "").split(",") if u.strip()],
        "name": name,
        # A node waits for its bus as long as it takes; a command gives up after a few tries.
        "max_reconnect_attempts": -1 if persistent else 2,
        "reconnect_time_wait": 0.5 if persistent else 0.2,
        "allow_reconnect": True,
        "connect_timeout": 5 if persistent else 2,
    }
    if cfg.user:
        opts["user"] = cfg.user
    if cfg.password:
        opts["password"] = cfg.password
    if cfg.token:
        opts["token"] = cfg.token
    if cfg.creds:
        opts["user_credentials"] = cfg.creds
    if cfg.nkey_seed:
        opts["nkeys_seed"] = cfg.nkey_seed
    if cfg.tls_ca or cfg.tls_cert:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.tls_ca)
        if cfg.tls_cert:
            ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        opts["tls"] = ctx
    return opts


def refusal(e: BaseException) -> str | None:
    """Why a server will never take this client as configured; None when trying again may help."""
    if isinstance(e, nats.errors.AuthorizationError) or "authorization violation" in str(e).lower():
        return "the server refused the credentials (authorization violation); check the user/password, token, nkey or creds"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"the server's TLS certificate is not trusted ({e.verify_message}); name its CA with tls_ca / --tls-ca"
    if isinstance(e, ssl.SSLError):
        return (
            f"the TLS handshake failed ({e.reason or e}); does the server want a client certificate "
            "(tls_cert and tls_key / --tls-cert and --tls-key)?"
        )
    return None


def cap_socket_reads(nc: Client, size: int = 64 * 1024) -> None:
    """asyncio reads 256 KiB per recv; a smaller read costs less per small message."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is not None and hasattr(transport, "max_size"):
        transport.max_size = size


def _drop_torn_connection_leftovers(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A one-shot command's loop: a socket error left in a future of nats-py's after a refused or
    closed connection is not news (the command already said why it could not connect, seen as a
    stray "Future exception was never retrieved ... ConnectionResetError" after a refused login)."""
    if context.get("message", "").startswith("Future exception was never retrieved") and isinstance(
        context.get("exception"), OSError
    ):
        return
    loop.default_exception_handler(context)


async def connect(cfg: NatsConfig, name: str, *, quiet: bool = False) -> Client:
    """Connect, or raise BusError naming why not.

    Credentials or a certificate the server refuses end the first attempt at once: no retry can
    fix them, and nats-py would retry them for ever (a TLS verify failure even past
    max_reconnect_attempts). A one-shot client (`quiet`: meshctl) also stops waiting after 15 s.
    A node (not `quiet`) waits for ever: the bus being out of reach is one ERROR naming it, and
    one line again when it answers, however many tries it takes in between.
    """
    connecting = True
    refused: list[str] = []
    last: list[BaseException] = []
    shown = redact(cfg.url)
    unreachable_since: list[float] = []

    def out_of_reach(e: BaseException) -> None:
        if quiet or unreachable_since:
            return
        unreachable_since.append(time.monotonic())
        log.error(
            "the bus at %s is out of reach (%s: %s); the children run, calls wait for it; trying again every %.1f s",
            shown,
            type(e).__name__,
            e,
            connect_options(cfg, name)["reconnect_time_wait"],
        )

    def back() -> None:
        if unreachable_since:
            log.warning("the bus at %s is reachable again after %.0f s", shown, time.monotonic() - unreachable_since[0])
            unreachable_since.clear()

    async def disconnected() -> None:
        if not quiet and not nc.is_closed:
            log.warning("disconnected from the bus; reconnecting")

    async def reconnected() -> None:
        cap_socket_reads(nc)
        if not quiet:
            url = nc.connected_url
            log.warning("reconnected to the bus at %s", redact(url.geturl()) if url else "?")
            back()

    async def error(e: Exception) -> None:
        last[:] = [e]
        why = refusal(e) if connecting else None
        if why is not None and not refused:
            refused.append(why)
            attempt.cancel()
            return
        if isinstance(e, (OSError, asyncio.TimeoutError, nats.errors.NoServersError)):
            out_of_reach(e)  # once per outage: a try every half second is not news
        elif not quiet:
            log.warning("bus: %s", e)

    if quiet:
        asyncio.get_running_loop().set_exception_handler(_drop_torn_connection_leftovers)
    nc = Client()
    attempt = asyncio.ensure_future(
        nc.connect(
            **connect_options(cfg, name, persistent=not quiet),
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
        )
    )
    try:
        await asyncio.wait_for(asyncio.shield(attempt), 15 if quiet else None)
    except BaseException as e:  # nats-py raises a variety of types here; all mean "not connected"
        attempt.cancel()
        try:
            await nc.close()
        except Exception:  # a client that never connected has little to close
            pass
        if refused:
            raise BusError(f"cannot connect to NATS at {shown}: {refused[0]}") from None
        if isinstance(e, asyncio.CancelledError):
            raise
        # NoServersError says only that the tries ran out; the last error says why.
        cause = last[0] if last else e
        raise BusError(f"cannot connect to NATS at {shown}: {type(cause).__name__}: {cause}") from None
    finally:
        connecting = False
    cap_socket_reads(nc)
    back()
    return nc


async def settle(nc: Client) -> None:
    """Return once every command written on `nc` so far has reached the server and been processed.

    nats-py's `flush()` writes its PING straight to the socket, ahead of commands still waiting
    in its own buffer (nats-py 2.x `Client._send_ping`), so one flush can come back before a SUB
    made just before it is processed (seen: a node said it served, and a call from another
    connection met "no responders"). The first flush moves the buffer to the socket; the second
    one's PING follows it."""
    await nc.flush()
    await nc.flush()


async def connect_lane(cfg: NatsConfig, name: str, on_error: Callable[[Exception], Awaitable[None]]) -> Client:
    """A connection of the node's own for one group of its requests (runtime/bus/service_api.py):
    the node's options, reconnecting for ever; one try to connect now (the node's own connection is
    up), its failure raised. Its drops are logged as the lane's, its other errors go to `on_error`."""

    async def disconnected() -> None:
        if not nc.is_closed:
            log.warning("bus: the connection of %s was dropped; reconnecting", name)

    async def reconnected() -> None:
        cap_socket_reads(nc)
        log.warning("bus: %s reconnected", name)

    nc = Client()
    await nc.connect(
        **connect_options(cfg, name, persistent=False),  # a few tries, not for ever: a serve() must end
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=on_error,
    )
    # Connected: from now on it reconnects as the node's own connection does (nats-py reads these
    # options at each reconnect).
    persistent = connect_options(cfg, name)
    nc.options["max_reconnect_attempts"] = persistent["max_reconnect_attempts"]
    nc.options["reconnect_time_wait"] = persistent["reconnect_time_wait"]
    cap_socket_reads(nc)
    return nc
