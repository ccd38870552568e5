"""meshctl as a user runs it: a node on its embedded bus, found by the other verbs on their own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, NodeProcess

# A real Python SDK child imports `mcp` (~0.6 s, more on a busy machine): give it time.
SDK_CONFIG = FAST_CONFIG.replace("init_timeout_s = 2", "init_timeout_s = 20")


def meshctl(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MESH_STATE_DIR=str(state))
    return subprocess.run([*MESHCTL, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def embedded_node(tmp_path: Path):
    mods = tmp_path / "mods"
    mods.mkdir()
    shutil.copytree(ROOT / "bundles" / "hello-python", mods / "hello-python")
    node = NodeProcess(tmp_path, mods, None, "cli-node", config=SDK_CONFIG)  # no --nats: the embedded bus
    node.wait_log("serving on")
    yield node
    node.kill()


def test_embedded_bus_call_status_tools_restart(embedded_node: NodeProcess) -> None:
    state = embedded_node.state_dir
    info = json.loads((state / "bus.json").read_text())
    assert info["embedded"] is True and info["url"].startswith("nats://127.0.0.1:")
    assert (state / "nats").is_dir()  # JetStream's store lives under the node's state folder
    deadline = time.monotonic() + 30
    while True:
        r = meshctl("call", "tool.hello-python.greet", '{"name":"Ada"}', state=state)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "Hello, Ada!"
    r = meshctl("call", "seat.echo.say", '{"text":"hi"}', "--json", state=state)
    assert r.returncode == 0 and json.loads(r.stdout)["content"][0]["text"] == "hi"
    r = meshctl("node", "status", "--json", state=state)
    status = json.loads(r.stdout)
    b = status["bundles"][0]
    assert (b["module"], b["language"], b["state"]) == ("hello-python", "python", "ready")
    assert b["tools"] == ["echo.say", "greet"] and b["pid"] > 0
    r = meshctl("node", "status", state=state)
    assert "hello-python/tools" in r.stdout and "ready" in r.stdout and "seat echo: held by hello-python" in r.stdout
    r = meshctl("tools", state=state)
    assert "mesh.tool.hello-python.greet" in r.stdout and "mesh.seat.echo.say" in r.stdout
    assert r.stdout.splitlines()[-1] == "2 tools on 1 node", r.stdout
    r = meshctl("node", "restart", "hello-python/tools", state=state)
    assert r.returncode == 0 and "restarting hello-python/tools" in r.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        b = json.loads(meshctl("node", "status", "--json", state=state).stdout)["bundles"][0]
        if b["state"] == "ready" and b["restarts"] == 1:
            break
        time.sleep(0.2)
    assert b["state"] == "ready" and b["restarts"] == 1, b
    r = meshctl("node", "status", "--name", "ghost", state=state)
    assert r.returncode == 1 and "mesh.node.ghost.status: no node of that name runs on this bus" in r.stderr
    r = meshctl("node", "restart", "no-such", state=state)
    assert r.returncode == 1 and "is not on this node" in r.stderr
    # Runtime errors reach the user as one line with the code.
    r = meshctl("call", "tool.hello-python.nope", state=state)
    assert r.returncode == 1 and r.stderr.startswith("meshctl: 404")
    r = meshctl("call", "tool.hello-python.greet", "[1]", state=state)
    assert r.returncode == 1 and r.stderr.startswith("meshctl: 400")
    r = meshctl("call", "greet", state=state)
    assert r.returncode == 2 and "tool.<module>.<tool>" in r.stderr


def test_no_local_node_is_a_clear_error(tmp_path: Path) -> None:
    r = meshctl("call", "tool.x.y", state=tmp_path / "nothing")
    assert r.returncode == 2 and "no local node found" in r.stderr and "--nats" in r.stderr
    r = meshctl("node", "status", "--name", "x", "--nats", "nats://127.0.0.1:1", state=tmp_path)
    assert r.returncode == 2 and "cannot connect to NATS" in r.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_time_is_a_usage_error(tmp_path: Path, value: str) -> None:
    """Before: 0 and -1 became a 1 ms deadline and a 504 from the node; now refused before any bus."""
    r = meshctl("call", "tool.x.y", "{}", "--timeout", value, state=tmp_path / "nothing")
    assert r.returncode == 2, r.stderr
    assert "argument --timeout" in r.stderr and "e.g. 30 or 0.5" in r.stderr and value in r.stderr


def test_a_reader_that_went_away_is_no_traceback(tmp_path: Path) -> None:
    """`meshctl ... | head` with the reader gone: exit 141 (as SIGPIPE would), nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [*MESHCTL, "module", "check", str(ROOT / "bundles" / "hello-python")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
