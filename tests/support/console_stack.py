"""The console's tests' parts: a real node on its embedded bus serving the first-party bundles, a real
`meshctl console` process, and Debian's Chromium driven by Playwright (never a browser download)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from runtime.bus.embedded import free_port
from runtime.wire.identity import os_person
from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, NodeProcess, make_module, wait_state

CHROMIUM = Path("/usr/bin/chromium")
DOCS_SHOTS = ROOT / "docs" / "console"
CONFIG = FAST_CONFIG.replace("init_timeout_s = 2", "init_timeout_s = 30")
BUNDLES = ("memory/tools", "handoff/tools", "hello-python/tools", "frail/tools")
SERVICE = "hello-service/daemon"  # a service bundle the node runs


def browser_or_fail() -> Path:
    """Debian's Chromium: its absence fails the test, naming the script that installs it."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/setup-browser.sh` (Debian's chromium + playwright)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("playwright for Python is missing: run `bash scripts/setup-browser.sh`")
    return CHROMIUM


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    path = browser_or_fail()
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(path), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


class Stack:
    """A node on its embedded bus with memory, handoff, two small Python bundles and a Go service."""

    def __init__(self, base: Path, humans: str | None = None, operators: list[str] | None = None) -> None:
        mods = base / "mods"
        for module in ("memory", "handoff", "hello-python", "hello-service"):
            shutil.copytree(ROOT / "bundles" / module, mods / module, ignore=shutil.ignore_patterns("__pycache__"))
        make_module(mods, "frail")  # a bundle the tests kill
        env = {"HANDOFF_HUMANS": humans} if humans else None
        config = CONFIG + (f"[console]\noperators = {json.dumps(operators)}\n" if operators else "")
        self.node = NodeProcess(base, mods, None, "console-node", config=config, env=env)
        self.base = base
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        self.node.wait_log("serving on", timeout=600)  # handoff is built first (Go, SQLite: a minute cold)
        info = json.loads((self.node.state_dir / "bus.json").read_text())
        self.url = info["url"]
        self.secret = {
            "mesh-node": (self.node.state_dir / "bus-mesh.password").read_text().strip(),
            "mesh-local": (self.node.state_dir / "bus-local.password").read_text().strip(),
            "mesh-console": (self.node.state_dir / "bus-console.password").read_text().strip(),
        }

    async def connect(self, user: str) -> Client:
        return await nats.connect(self.url, user=user, password=self.secret[user], name=f"test-{user}")

    async def ready(self) -> None:
        ops = await self.connect("mesh-node")
        try:
            for bundle in BUNDLES:
                await wait_state(ops, self.node.name, bundle, "ready", timeout=600)
            await wait_state(ops, self.node.name, SERVICE, "running", timeout=600)
        finally:
            await ops.close()

    def stop(self) -> None:
        self.node.kill()


class ConsoleProcess:
    """`meshctl console` as a real process; `login` is the link it printed (local login)."""

    def __init__(self, stack: Stack, *extra: str, name: str = "console", port: int | None = None) -> None:
        self.port = port or free_port()
        self.log_path = stack.base / f"{name}-{self.port}.log"
        env = dict(os.environ, MESH_STATE_DIR=str(stack.node.state_dir))
        argv = [*MESHCTL, "console", "--http", f"127.0.0.1:{self.port}", *extra]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb")
        )
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.login = ""  # the local login's link
        self.login_issuer = ""  # or the issuer it sends people to
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log()
            if m := re.search(r"^console: (\S+)/ \((.*)\)$", text, re.M):
                found = re.search(r"log in: (\S+)", m.group(2))
                self.login = found.group(1) if found else ""
                through = re.search(r"log in through (\S+)", m.group(2))
                self.login_issuer = through.group(1) if through else ""
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"meshctl console exited ({self.proc.returncode}):\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"meshctl console did not start within 60 s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def person_id() -> str:
    return os_person().id
