"""The node as a process among others: credentials in its bus URL stay with it, a same-user child
cannot read its environment, an unreachable bus delays calls but not children or a stop, and
its name follows the manifest's name rule.
"""

from __future__ import annotations

import asyncio
import json
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from runtime.bus.embedded import free_port
from tests.faults.conftest import meshctl
from tests.faults.security_support import ConfiguredServer
from tests.support import mesh
from tests.support.mesh import NodeProcess, call, make_module, marked_processes, wait_for, wait_state

SECRET = "url-secret-9d2"


# --- item 8 ------------------------------------------------------------------------------------
async def test_credentials_in_the_nats_url_appear_nowhere(tmp_path: Path, node_factory) -> None:
    srv = ConfiguredServer(tmp_path / "srv", f"authorization {{ user: node, password: {SECRET} }}").start()
    try:
        url = f"nats://node:{SECRET}@127.0.0.1:{srv.port}"
        make_module(tmp_path / "mods", "alpha")
        node = node_factory(tmp_path / "mods", url=url)
        nc = await nats.connect(srv.url, user="node", password=SECRET, max_reconnect_attempts=-1)
        await wait_state(nc, node.name, "alpha/tools", "ready")
        r = meshctl("node", "status", "--json", "--name", node.name, "--nats", url)
        assert r.returncode == 0, r.stderr
        shown = json.loads(r.stdout)["url"]
        assert SECRET not in r.stdout and f"127.0.0.1:{srv.port}" in shown, shown
        # The bus goes away and comes back: the lines about it name the server, not the password.
        srv.stop()
        srv.start()
        node.wait_log("reconnected to the bus", timeout=20)
        bus_file = node.state_dir / "bus.json"
        mode = stat.S_IMODE(bus_file.stat().st_mode)
        assert mode == 0o600, oct(mode)
        assert SECRET not in bus_file.read_text(), bus_file.read_text()
        log = node.log()
        assert f"127.0.0.1:{srv.port}" in log and "serving on" in log
        assert SECRET not in log, [line for line in log.splitlines() if SECRET in line]
        await nc.close()
        # A node refused by the server names the URL it tried, without the password.
        wrong = NodeProcess(
            tmp_path,
            tmp_path / "mods",
            f"nats://node:wrong-pw-55@127.0.0.1:{srv.port}",
            "wrongpw",
            config=mesh.FAST_CONFIG,
        )
        assert wrong.proc.wait(30) == 2
        assert "authoriz" in wrong.log().lower() and "wrong-pw-55" not in wrong.log(), wrong.log()
    finally:
        srv.stop()


# --- item 10 -----------------------------------------------------------------------------------
PROBE = """
import os, sys
# Two halves: the probe's own environment never holds the whole secret.
secret = (os.environ["PROBE_HEAD"] + os.environ["PROBE_TAIL"]).encode()
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if secret in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        found.append(pid + " " + c.read().replace(b"\\0", b" ").decode(errors="replace")[:120])
        except OSError:
            pass
with open(os.environ["PROBE_OUT"], "w") as out:
    out.write("\\n".join(found) if found else "none")
os.execv(sys.executable, [sys.executable, "raw_child.py"])
"""


async def test_a_same_user_child_cannot_read_the_environment_of_the_node(
    world_readable_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared_dir = world_readable_dir
    shared_dir.chmod(0o777)  # the node, run as nobody, writes its state here
    nobody = pwd.getpwnam("nobody")
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    # The system Python with this checkout and its packages on the path: the venv's interpreter
    # may live where only root can reach (pyenv under /root).
    site = next(p for p in sys.path if p.endswith("site-packages") and ".venv" in p)
    env = {
        "HOME": str(shared_dir),
        "PYTHONPATH": f"{mesh.ROOT}:{site}",
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
    }
    meshctl_as_nobody = [*as_nobody, "/usr/bin/python3", "-m", "runtime.meshctl"]
    check = subprocess.run([*meshctl_as_nobody, "--help"], cwd=mesh.ROOT, env=env, capture_output=True, text=True)
    if check.returncode:
        pytest.skip(f"`nobody` cannot run the node on /usr/bin/python3 here: {check.stderr[-300:]}")
    secret = "node-secret-in-env-4a7"
    out = shared_dir / "probe.out"
    probe_env = {"PROBE_OUT": str(out), "PROBE_HEAD": secret[:9], "PROBE_TAIL": secret[9:]}
    folder = make_module(shared_dir / "mods", "alpha", env=probe_env)
    (folder / "probe.py").write_text(PROBE)
    manifest = folder / "module.toml"
    manifest.write_text(manifest.read_text().replace('"raw_child.py"]', '"probe.py"]'))
    for path in (shared_dir / "mods", folder):
        path.chmod(0o755)
    # The node runs as an ordinary user (root may read any process's memory), its children as
    # the same user: the case where nothing but the node itself keeps its environment private.
    monkeypatch.setattr(mesh, "MESHCTL", meshctl_as_nobody)
    node = NodeProcess(shared_dir, shared_dir / "mods", None, "undumpable", env={**env, "NODE_SECRET": secret})
    try:
        node.wait_log("serving on")
        await wait_for(lambda: out.exists() and out.read_text(), "the probe child ran", timeout=20)
        found = out.read_text()
        print(f"\nprocesses a same-user child could read the node's secret from: {found}")
        assert found == "none", found
    finally:
        node.kill()


# --- item 13 -----------------------------------------------------------------------------------
def _errors(log: str) -> list[str]:
    """The bus's ERROR lines (the raw child's undeclared `echo.say` seat verb has its own ERROR)."""
    return [line for line in log.splitlines() if " ERROR mesh.bus" in line]


async def test_an_unreachable_bus_the_children_start_one_error_and_the_first_sigterm_stops_it(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    make_module(tmp_path / "mods", "alpha")
    node = NodeProcess(tmp_path, tmp_path / "mods", url, "unreach-stop")
    try:
        await wait_for(lambda: marked_processes(node.name), "the child started without a bus", timeout=20)
        await asyncio.sleep(3)  # several rounds of retries
        log = node.log()
        errors = _errors(log)
        warnings = [line for line in log.splitlines() if " WARNING " in line]
        print(f"\nafter 3 s without a bus: {len(errors)} ERROR, {len(warnings)} WARNING lines")
        assert len(errors) == 1 and url in errors[0], errors
        assert len(warnings) <= 2, warnings
        started = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        code = node.proc.wait(30)
        took = time.monotonic() - started
        print(f"first SIGTERM to exit: {took:.2f} s (drain_timeout_s = 10)")
        assert code == 0 and took < 10, (code, took, node.log()[-2000:])
        assert not marked_processes(node.name)
    finally:
        node.kill()


async def test_an_unreachable_bus_that_comes_back_is_named_and_served(tmp_path: Path, servers) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    make_module(tmp_path / "mods", "alpha")
    node = NodeProcess(tmp_path, tmp_path / "mods", url, "unreach-back")
    try:
        await wait_for(lambda: marked_processes(node.name), "the child started without a bus", timeout=20)
        await asyncio.sleep(1.5)
        servers("late", port=port)
        node.wait_log("serving on", timeout=20)
        log = node.log()
        assert len(_errors(log)) == 1, _errors(log)
        back = [line for line in log.splitlines() if "reachable" in line and url in line]
        assert back, log
        nc = await mesh.client(url)
        code, _ = await call(nc, "mesh.tool.alpha.echo", {"bus": "back"})
        assert code == 200
        await nc.close()
    finally:
        node.kill()


# --- item 16, first half -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["*", ">", "a.b", "A b", "x" * 70])
def test_a_node_name_follows_the_manifest_name_rule(tmp_path: Path, nats_server, name: str) -> None:
    r = meshctl(
        "node", "run", "--name", name, "--nats", nats_server.url, "--state-dir", str(tmp_path / "s"), timeout=15
    )
    assert r.returncode == 2, (r.returncode, r.stderr[-1000:])
    assert "node name" in r.stderr and "[a-z][a-z0-9-]{0,62}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    for verb in (("node", "status"), ("node", "restart", "alpha")):
        r = meshctl(*verb, "--name", name, "--nats", nats_server.url, timeout=15)
        assert r.returncode == 2 and "node name" in r.stderr, (verb, r.returncode, r.stderr)


def test_the_host_name_becomes_a_valid_node_name() -> None:
    from runtime.config import NodeConfig, finish, node_name_from_host

    assert finish(NodeConfig(state_dir="/tmp/x")).name  # whatever this host is called
    assert node_name_from_host("1Box_name.example.com") == "n1box-name"
    assert node_name_from_host("") == "node"


# --- issue 30 item 4 ---------------------------------------------------------------------------
# What the operator's verbs need and the node never does: the MCP face and its web stack, the
# import clients. `meshctl node run` imports each verb's needs only when that verb runs.
NOT_IN_THE_NODE = ("mcp", "starlette", "sse_starlette", "uvicorn", "httpx", "httpcore", "pydantic", "pydantic_core")
NOT_IN_THE_NODE_OF_OURS = ("runtime.meshctl.face", "runtime.meshctl.imports")


def imported_modules(log: str) -> set[str]:
    """The modules a process imported over its life, from its `-X importtime` lines on stderr."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in log.splitlines()
        if line.startswith("import time:") and line.count("|") == 2 and "imported package" not in line
    }


async def test_node_run_loads_no_mcp_server_nor_starlette(tmp_path: Path, node_factory) -> None:
    make_module(tmp_path / "mods", "hello")
    # PYTHONPROFILEIMPORTTIME is -X importtime: every import the node makes, at start and later, on its stderr.
    node = node_factory(tmp_path / "mods", env={"PYTHONPROFILEIMPORTTIME": "1"})
    nc = await mesh.client(node.bus_url())
    await wait_state(nc, node.name, "hello/tools", "ready")
    code, _ = await call(nc, "mesh.tool.hello.echo", {"x": 1})
    assert code == 200
    await mesh.status(nc, node.name)
    await nc.close()
    assert node.terminate() == 0
    modules = imported_modules(node.log())
    # The check can fail: the node's own modules are seen.
    assert {"runtime.node.node", "runtime.calls.dispatch", "runtime.meshctl.cli"} <= modules, sorted(modules)[:20]
    foreign = sorted(m for m in modules if m.split(".")[0] in NOT_IN_THE_NODE or m.startswith(NOT_IN_THE_NODE_OF_OURS))
    assert not foreign, f"`meshctl node run` imported {len(foreign)} modules it never uses: {foreign[:15]}"
    assert not any(m == "mcp.server" or m.startswith(("mcp.server.", "starlette")) for m in modules)
    print(f"`meshctl node run` imported {len(modules)} modules, none of the face's stack")
