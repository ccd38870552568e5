"""The in-process node tier: a real `Node` in the test's own event loop, with fake children
(tests/support/fake_child.py), on one nats-server for the whole session.

Each test gets an account of its own on that server (its own subjects and its own JetStream:
leases, homes, membership, call objects), so nothing of one test is seen by the next, and no
server is started per test. No child process is started: the launcher's `ChildProcess` is the
fake's, and the reaper is inert (the fakes' pids are nobody's).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from launcher.bundle import HealthPolicy, RestartPolicy
from launcher.reaper import Reaper
from manifests import load_module
from runtime.bus.embedded import nats_server_binary
from runtime.config import CatalogConfig, NatsConfig, NodeConfig
from runtime.hosting.placement import Placement, from_source
from runtime.node.modules import ModuleHost
from runtime.node.node import Node
from runtime.wire.callproto import FRAME
from runtime.wire.control import NodeStatus
from runtime.wire.subjects import STATUS, node_subject
from tests.support.mesh import stop_process, wait_port

ACCOUNTS = 400  # more than the tests of one session that take one
_taken = itertools.count()

FAST_RESTART = RestartPolicy(max_restarts=3, window_s=30, backoff_initial_s=0.02, backoff_max_s=0.05, stable_after_s=5)
FAST_HEALTH = HealthPolicy(init_timeout_s=0.5, ping_interval_s=30, ping_timeout_s=1, ping_misses=2, stop_grace_s=0.1)


class AccountsServer:
    """One nats-server for the session, with `ACCOUNTS` accounts, each with JetStream of its own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0  # the server picks one and says which (a port picked here could be taken by then)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> AccountsServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        accounts = "\n".join(
            f'  T{i} {{ jetstream: enabled, users: [ {{ user: "t{i}", password: "p{i}" }} ] }}' for i in range(ACCOUNTS)
        )
        conf = self.workdir / "server.conf"
        store = json.dumps(str(self.workdir / "js"))
        conf.write_text(f"listen: 127.0.0.1:-1\njetstream {{ store_dir: {store} }}\naccounts {{\n{accounts}\n}}\n")
        ports = self.workdir / "ports"
        ports.mkdir(exist_ok=True)
        log = open(self.workdir / "server.log", "ab")
        argv = [nats_server_binary(), "-c", str(conf), "--ports_file_dir", str(ports)]
        if os.environ.get("MESH_TEST_NATS_TRACE"):
            argv += ["-DV", "-l", str(self.workdir / "server.log")]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 10
        found = ports / f"{Path(argv[0]).name}_{self.proc.pid}.ports"
        while not found.is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the session's nats-server did not start; see {self.workdir / 'server.log'}")
            time.sleep(0.01)
        time.sleep(0.01)  # written whole right after it is made
        self.port = int(json.loads(found.read_text())["nats"][0].rsplit(":", 1)[1])
        wait_port(self.port)
        return self

    def stop(self) -> None:
        stop_process(self.proc)

    def account(self) -> NatsConfig:
        """A fresh account nobody used in this session."""
        i = next(_taken)
        if i >= ACCOUNTS:
            raise RuntimeError(f"more than {ACCOUNTS} tests took an account; raise ACCOUNTS")
        return NatsConfig(url=self.url, user=f"t{i}", password=f"p{i}")


class InertReaper(Reaper):
    """No watchdog process and no cgroups: the fake children have no processes to reap."""

    async def start(self, cgroups: bool = True) -> None:
        self.cgroups = None

    def register(self, pgid: int) -> None:
        pass

    def unregister(self, pgid: int) -> None:
        pass

    async def close(self) -> None:
        pass


def module_folder(
    root: Path,
    name: str,
    *,
    seats: str = "",
    timeout_ms: int = 2000,
    bundle: str = "",
    version: str = "0.1.0",
    folder: str = "",
    extra: str = "",
) -> Path:
    """A module whose one tools bundle is a Python child (faked): `bundle` adds TOML to that bundle,
    `seats` and `extra` after it (more [[seat]] or [[bundle]] tables); `folder` names the folder
    when it is not the module's name (two versions side by side)."""
    where = root / (folder or name)
    where.mkdir(parents=True, exist_ok=True)
    (where / "main.py").write_text("# the fake child runs in the test's process\n")
    (where / "module.toml").write_text(
        f'name = "{name}"\nversion = "{version}"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "python"\n'
        f'source = "."\nentry = ["python", "main.py"]\ntimeout_ms = {timeout_ms}\n{bundle}\n{seats}\n{extra}\n'
    )
    return where


def placement(folder: Path) -> Placement:
    return from_source(load_module(folder))


@dataclass
class Mesh:
    """One test's account: its bus connection, its nodes, and where their state lives.

    It owns one task per node (pytest-asyncio sets a fixture up and tears it down in different
    tasks, so no task group can span the test): `close` stops every node and waits for its task."""

    tmp: Path
    nats: NatsConfig
    nc: Client
    nodes: dict[str, Node] = field(default_factory=dict)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def config(self, name: str, **more: Any) -> NodeConfig:
        """The node's config: fast policies, this test's account; `more` overrides any field."""
        fields: dict[str, Any] = dict(
            name=name,
            state_dir=str(self.tmp / f"state-{name}"),
            nats=self.nats,
            restart=FAST_RESTART,
            health=FAST_HEALTH,
            drain_timeout_s=0.5,  # a test that ends with calls in flight waits this long for them
            membership=False,  # the reconciler's two buckets cost each test; the delivery tests ask for it
            # The session's server reserves each account's bucket whole (strict JetStream): 1 GiB a test
            # filled its disk's share after some forty tests, and the catalogue could not be made.
            catalog=CatalogConfig(max_bytes=8 * 1024 * 1024),
        )
        return NodeConfig(**(fields | more))

    async def start(self, name: str, *folders: Path, **config: Any) -> Node:
        """A node serving `folders`, running until the test ends (or `stop`); returns once it serves."""
        node = Node(self.config(name, **config), reaper=InertReaper(name))
        self.nodes[name] = node
        self._tasks[name] = asyncio.get_running_loop().create_task(node.run([placement(f) for f in folders]))
        with anyio.fail_after(10):
            await node.wait_ready()
        return node

    async def stop(self, name: str) -> None:
        """A clean stop (as SIGTERM): calls in flight answered, leases released."""
        self.nodes[name].request_stop()
        with anyio.fail_after(10):
            await self._tasks[name]

    async def kill(self, name: str) -> None:
        """As SIGKILL, as far as the bus can tell: the node's task is cancelled, so nothing of a clean
        stop happens (no drain, no 503 `node_stopping`, leases not released), and its connection closes."""
        task = self._tasks[name]
        task.cancel()
        with anyio.fail_after(10):
            await asyncio.gather(task, return_exceptions=True)

    def running(self, name: str) -> bool:
        """Whether node `name`'s `run` goes on (it never ends of what a module or a caller does)."""
        return not self._tasks[name].done()

    def modules(self, name: str) -> ModuleHost:
        """The module host of a serving node: what delivery and the control subjects change."""
        serving = self.nodes[name].serving
        assert serving is not None, f"node {name} does not serve"
        return serving.control.modules

    async def close(self) -> None:
        for name, task in self._tasks.items():
            if not task.done():
                self.nodes[name].request_stop()
        with anyio.move_on_after(10):
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def status(self, name: str) -> NodeStatus:
        msg = await self.nc.request(node_subject(name, STATUS), b"", timeout=2)
        return msgspec.json.decode(msg.data, type=NodeStatus)

    async def bundle_state(self, name: str, key: str, state: str, timeout: float = 5) -> NodeStatus:
        """Wait until bundle `key` of node `name` shows `state` in its status; the status then."""
        with anyio.fail_after(timeout):
            while True:
                status = await self.status(name)
                bundle = status.bundle(key)
                if bundle is not None and bundle.state == state:
                    return status
                await anyio.sleep(0.01)

    async def call(
        self, subject: str, args: Any = None, headers: dict[str, str] | None = None, timeout: float = 5
    ) -> tuple[dict[str, Any], str | None]:
        """(the reply body, its Nats-Service-Error-Code or None)."""
        msg = await self.nc.request(subject, _body(args), timeout=timeout, headers=headers)
        code = (msg.headers or {}).get("Nats-Service-Error-Code")
        return (json.loads(msg.data) if msg.data else {}), code

    async def frames(
        self, subject: str, args: Any = None, headers: dict[str, str] | None = None, wait: float = 5
    ) -> list[Msg]:
        """Every message on a fresh inbox: interim frames (Mesh-Frame) up to and with the final reply,
        or what came within `wait` s (nothing, for a call that is not answered)."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        got: list[Msg] = []
        try:
            await self.nc.publish(subject, _body(args), reply=inbox, headers=headers)
            with anyio.move_on_after(wait):
                async for msg in sub.messages:
                    got.append(msg)
                    if not (msg.headers and FRAME in msg.headers):
                        break
        finally:
            await sub.unsubscribe()
        return got


def _body(args: Any) -> bytes:
    return b"" if args is None else (args if isinstance(args, bytes) else json.dumps(args).encode())


def code_of(msg: Msg) -> str | None:
    """A reply's Nats-Service-Error-Code, None for a result."""
    return (msg.headers or {}).get("Nats-Service-Error-Code")


async def until(check: Callable[[], Any], what: str, timeout: float = 5, every: float = 0.005) -> Any:
    """Poll `check` (a function or a coroutine function) until it gives something true; that, or fail naming `what`."""
    last: Any = None
    with anyio.move_on_after(timeout):
        while True:
            last = check()
            if inspect.isawaitable(last):
                last = await last
            if last:
                return last
            await anyio.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


@contextlib.asynccontextmanager
async def mesh(tmp: Path, nats_config: NatsConfig) -> AsyncIterator[Mesh]:
    nc = await nats.connect(nats_config.url or "", user=nats_config.user, password=nats_config.password)
    m = Mesh(tmp, nats_config, nc)
    try:
        yield m
    finally:
        await m.close()
        await nc.close()
