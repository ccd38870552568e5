"""Test support: a real nats-server, a real node process, module folders with real children."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import nats
from nats.aio.client import Client

from runtime.bus.embedded import free_port, nats_server_argv

ROOT = Path(__file__).resolve().parents[2]
RAW_CHILD = ROOT / "tests" / "children" / "raw_child.py"
MESHCTL = [sys.executable, "-m", "runtime.meshctl"]


class NatsServer:
    """A nats-server on loopback, started and ended by the test that owns it."""

    def __init__(self, workdir: Path, port: int | None = None, extra: list[str] | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [*nats_server_argv(self.port, self.workdir / "js"), *self.extra]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(self.workdir / "server.log", "ab"))
        wait_port(self.port)
        return self

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 5) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds: a server the test started ends with it."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_port(port: int, timeout: float = 10) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def make_module(
    root: Path,
    name: str,
    *,
    env: dict[str, str] | None = None,
    seats: list[str] | None = None,
    timeout_ms: int = 5000,
    extra_bundle: str = "",
) -> Path:
    """A module folder whose tools bundle is the raw test child, told how to behave by env.

    Every child is confined (docs/internals.md, "Confinement"): an absolute path in `env` is a
    file the child writes for the test (its call log, a marker), so its folder is declared
    writable, as a module's manifest would declare it."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(RAW_CHILD, folder / "raw_child.py")
    env_line = ", ".join(f'{k} = "{v}"' for k, v in (env or {}).items())
    written = sorted({str(Path(v).parent) for v in (env or {}).values() if v.startswith("/")})
    for where in written:
        Path(where).mkdir(parents=True, exist_ok=True)
    if written and "write =" not in extra_bundle:
        extra_bundle = f"write = {json.dumps(written)}\n{extra_bundle}"
    text = (
        f'name = "{name}"\nversion = "0.1.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "python"\n'
        f'source = "."\nentry = ["python", "raw_child.py"]\ntimeout_ms = {timeout_ms}\nenv = {{ {env_line} }}\n{extra_bundle}\n'
    )
    for seat in seats or []:
        text += f'\n[[seat]]\nname = "{seat}"\n'
    (folder / "module.toml").write_text(text)
    return folder


FAST_CONFIG = """
drain_timeout_s = 10
[restart]
max_restarts = 3
window_s = 30
backoff_initial_s = 0.1
backoff_max_s = 0.4
stable_after_s = 5
[health]
init_timeout_s = 2
ping_interval_s = 0.5
ping_timeout_s = 0.5
ping_misses = 2
stop_grace_s = 1
"""


class NodeProcess:
    """`meshctl node run` as a real process."""

    def __init__(
        self,
        workdir: Path,
        manifests: Path,
        url: str | None,
        name: str,
        config: str = FAST_CONFIG,
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.url = url
        self.state_dir = workdir / f"state-{name}"
        self.config = workdir / f"node-{name}.toml"
        self.config.write_text(config)
        self.log_path = workdir / f"node-{name}.log"
        argv = [
            *MESHCTL,
            "node",
            "run",
            "--manifests",
            str(manifests),
            "--name",
            name,
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(self.config),
            *(extra_args or []),
        ]
        if url:
            argv += ["--nats", url]
        elif "--embedded-port" not in (extra_args or []):
            argv += ["--embedded-port", "0"]
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=full_env, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb")
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited ({self.proc.returncode}) before logging {text!r}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"node did not log {text!r} within {timeout} s:\n{self.log()}")

    def bus_url(self) -> str:
        if self.url:
            return self.url
        return json.loads((self.state_dir / "bus.json").read_text())["url"]

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


async def client(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)


async def status(nc: Client, node: str) -> dict[str, Any]:
    msg = await nc.request(f"mesh.node.{node}.status", b"", timeout=5)
    return json.loads(msg.data)


async def bundle_status(nc: Client, node: str, key: str) -> dict[str, Any]:
    for b in (await status(nc, node))["bundles"]:
        if f"{b['module']}/{b['bundle']}" == key:
            return b
    raise KeyError(key)


# What a check may raise while what it waits for is not there yet (a node starting, a status without the key).
NOT_YET: tuple[type[BaseException], ...] = (nats.errors.TimeoutError, nats.errors.NoRespondersError, KeyError, OSError)


async def wait_for(
    check: Callable[[], Any],
    what: str,
    timeout: float = 15,
    every: float = 0.05,
    ok: Callable[[Any], Any] = bool,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """Poll `check` (plain or async) until `ok` says yes to what it gives (by default: something
    true); that value is returned. Fails naming `what` and the last value or `not_yet` error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except not_yet as e:
            last = e
        else:
            if ok(last):
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; last {last!r}")
        await asyncio.sleep(every)


async def wait_state(nc: Client, node: str, key: str, state: str, timeout: float = 15) -> dict[str, Any]:
    status: dict[str, Any] = await wait_for(
        lambda: bundle_status(nc, node, key),
        f"{key} reaching {state}",
        timeout,
        ok=lambda last: last["state"] == state,
        not_yet=(KeyError, nats.errors.TimeoutError, nats.errors.NoRespondersError),
    )
    return status


async def call(
    nc: Client, subject: str, args: Any = None, timeout: float = 10, raw: bytes | None = None
) -> tuple[int, Any]:
    """(code, body): 200 and the CallToolResult, or the runtime error code and its JSON body."""
    data = raw if raw is not None else json.dumps(args if args is not None else {}).encode()
    msg = await nc.request(subject, data, timeout=timeout)
    if msg.headers and "Nats-Service-Error-Code" in msg.headers:
        return int(msg.headers["Nats-Service-Error-Code"]), json.loads(msg.data)
    return 200, json.loads(msg.data)


def marked_processes(node_name: str) -> list[int]:
    """Every process on this machine whose environment says it is a child of that node."""
    want = f"MESH_NODE={node_name}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
