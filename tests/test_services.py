"""Service and step bundles on a node without systemd: the node runs them itself.

One module with a step, a service and a tools bundle, delivered over JetStream to a real node:
the step ran once before the tools answered (and not again after a node restart); the
service runs with the child environment contract, is restarted after SIGKILL, upgraded with
the module and stopped with no process left when the module is removed; a failing step
refuses its version while the old one keeps serving. From source: a step past its timeout
refuses the module, and the Go hello-service writes its heartbeat. The systemd path's
units are checked with `systemd-analyze verify` in tests/test_units.py; what needs systemd as
PID 1 is at the end of this file and says so when it cannot run here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from launcher.supervise import describe_exit
from runtime.config import NodeConfig, ServicesConfig
from runtime.hosting.services import choose_host
from tests.support.mesh import FAST_CONFIG, MESHCTL, RAW_CHILD, ROOT, alive, call, client, status, wait_for, wait_state
from toolchains.artifact import ArtifactMeta
from toolchains.pack import pack

pytestmark = pytest.mark.slow

NODE_RUNS_SERVICES = FAST_CONFIG + '\n[services]\nhost = "node"\n'

STEP = """\
import os, sys, time
with open(os.path.join(os.environ["MESH_DATA_DIR"], "steps.log"), "a") as f:
    f.write(f"{os.environ['STEP_VERSION']} {time.time():.6f} {os.getpid()}\\n")
print("migrating", os.environ["STEP_VERSION"], file=sys.stderr)
if os.environ.get("STEP_FAIL"):
    print(f"migration {os.environ['STEP_VERSION']} failed: column x already exists", file=sys.stderr)
    sys.exit(3)
time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
"""

DAEMON = """\
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
data, version = os.environ["MESH_DATA_DIR"], os.environ["SVC_VERSION"]
with open(os.path.join(data, f"env-{version}.json"), "w") as f:
    json.dump(dict(os.environ), f)
print(f"daemon {version} up, pid {os.getpid()}", file=sys.stderr, flush=True)
while True:
    with open(os.path.join(data, f"beat-{version}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(0.2)
"""


def manifest(version: str, starts: Path, *, step_env: str = "", step_timeout_ms: int = 10000) -> str:
    return f"""\
name = "hosted"
version = "{version}"

[[bundle]]
name = "migrate"
kind = "step"
language = "python"
source = "src"
entry = ["python", "step.py"]
timeout_ms = {step_timeout_ms}
env = {{ STEP_VERSION = "{version}"{step_env} }}

[[bundle]]
name = "daemon"
kind = "service"
language = "python"
source = "src"
entry = ["python", "daemon.py"]
env = {{ SVC_VERSION = "{version}" }}

[[bundle]]
name = "tools"
kind = "tools"
language = "python"
source = "src"
entry = ["python", "raw_child.py"]
env = {{ RAW_VERSION = "{version}", RAW_START_LOG = "{starts}" }}
write = ["{starts.parent}"]  # the test's own folder for the start log: confined, it can write nowhere else
"""


def module_source(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(RAW_CHILD, folder / "raw_child.py")
    (folder / "step.py").write_text(STEP)
    (folder / "daemon.py").write_text(DAEMON)
    return folder


def artifacts(out: Path, version: str, starts: Path, **kw: Any) -> list[Path]:
    """The module's three bundles as real artifacts, packed by the project's packer."""
    text = manifest(version, starts, **kw)
    stage = module_source(out / f"stage-{version}")
    entries = {"migrate": ["python", "step.py"], "daemon": ["python", "daemon.py"], "tools": ["python", "raw_child.py"]}
    kinds = {"migrate": "step", "daemon": "service", "tools": "tools"}
    return [
        pack(
            stage,
            ArtifactMeta(
                module="hosted",
                bundle=name,
                version=version,
                kind=kinds[name],  # type: ignore[arg-type]
                language="python",
                entry=entry,
                manifest=text,
            ),
            out,
        )
        for name, entry in entries.items()
    ]


def deliver(paths: list[Path], node: str, url: str) -> None:
    r = subprocess.run(
        [*MESHCTL, "bundle", "deliver", *map(str, paths), "--node", node, "--nats", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def step_lines(data: Path) -> list[tuple[str, float]]:
    path = data / "steps.log"
    if not path.exists():
        return []
    return [(v, float(t)) for v, t, _ in (line.split() for line in path.read_text().splitlines())]


def module_processes(node: str, module: str) -> list[int]:
    """Every live process whose environment says it belongs to this module on this node."""
    want = {f"MESH_NODE={node}".encode(), f"MESH_MODULE={module}".encode()}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if want <= set(f.read().split(b"\0")) and alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


async def beating(data: Path, version: str, pid: int) -> bool:
    """The daemon of `version` with this pid has written its beat (running comes at its spawn)."""
    path = data / f"beat-{version}"
    return path.exists() and path.read_text() == str(pid)


async def until(check: Any, what: str, timeout: float = 30) -> Any:
    # Any error is "not yet": a node starting has no responders, a status no such bundle yet.
    return await wait_for(check, what, timeout, every=0.1, not_yet=(Exception,))


async def test_service_and_step_delivered_to_a_node_without_systemd(tmp_path: Path, node_factory, nats_server) -> None:
    empty = tmp_path / "none"
    empty.mkdir()
    starts = tmp_path / "starts" / "tools-starts.log"
    starts.parent.mkdir()
    start = dict(name=f"hosting-{os.getpid()}", config=NODE_RUNS_SERVICES, env={"MESH_TEST_SECRET": "do-not-leak"})
    node = node_factory(empty, **start)
    data = node.state_dir / "data" / "hosted"
    nc = await client(nats_server.url)
    try:

        async def version_is(v: str) -> bool:
            code, body = await call(nc, "mesh.tool.hosted.version", {}, timeout=5)
            return code == 200 and body["structuredContent"]["version"] == v

        # 1. Delivered: the step ran once, before the tools child started; then the tools answer.
        deliver(artifacts(tmp_path / "out", "1.0.0", starts), node.name, nats_server.url)
        await until(lambda: version_is("1.0.0"), "hosted 1.0.0 answering")
        [(v, step_at)] = step_lines(data)
        tools_started = float(starts.read_text().split()[0])
        assert v == "1.0.0" and step_at < tools_started
        # 2. The service runs, supervised by the node, with the child environment contract.
        daemon = await wait_state(nc, node.name, "hosted/daemon", "running")
        assert (daemon["kind"], daemon["runs"], daemon["language"], daemon["tools"]) == (
            "service",
            "node",
            "python",
            [],
        )
        await until(lambda: beating(data, "1.0.0", daemon["pid"]), "the daemon's first beat")
        env = json.loads((data / "env-1.0.0.json").read_text())
        assert env["MESH_NODE"] == node.name and env["MESH_MODULE"] == "hosted" and env["MESH_BUNDLE"] == "daemon"
        assert env["MESH_DATA_DIR"] == str(data) and env["SVC_VERSION"] == "1.0.0"
        assert "MESH_TEST_SECRET" not in env  # the node's own environment stays home
        assert "service bundles run by node: [services] host = node" in node.log()
        # `meshctl node status` shows it beside the tools bundle.
        r = subprocess.run(
            [*MESHCTL, "node", "status", "--name", node.name, "--nats", nats_server.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        row = next(line.split() for line in r.stdout.splitlines() if line.startswith("hosted/daemon"))
        # KIND LANGUAGE RUNS STATE PID MCP RESTARTS: a service speaks no MCP, so its MCP column is "-".
        assert row[1:8] == ["service", "python", "node", "running", str(daemon["pid"]), "-", "0"], r.stdout
        assert any(line.split()[:2] == ["hosted/tools", "tools"] for line in r.stdout.splitlines()), r.stdout

        # 3. SIGKILL: restarted by the node, the exit named.
        os.kill(daemon["pid"], signal.SIGKILL)

        async def restarted() -> dict[str, Any] | None:
            b = await wait_state(nc, node.name, "hosted/daemon", "running")
            return b if b["pid"] != daemon["pid"] and b["restarts"] == 1 else None

        killed = await until(restarted, "the daemon restarted")
        assert killed["last_exit"] == describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
        assert not alive(daemon["pid"])
        # An operator's restart reaches a service as it does a tools bundle: SIGTERM, a new pid.
        r = subprocess.run(
            [*MESHCTL, "node", "restart", "hosted/daemon", "--name", node.name, "--nats", nats_server.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0 and "restarting hosted/daemon" in r.stdout, r.stderr

        async def restarted_again() -> dict[str, Any] | None:
            b = await wait_state(nc, node.name, "hosted/daemon", "running")
            return b if b["pid"] != killed["pid"] and b["restarts"] == 2 else None

        again = await until(restarted_again, "the daemon restarted by the operator")
        assert again["last_exit"] == "exit code 0" and not alive(killed["pid"])  # it took SIGTERM and exited

        # 4. The node restarts: the module comes back, its step does not run again for 1.0.0,
        #    and the node's stop took the daemon with it.
        assert node.terminate() == 0
        assert not alive(again["pid"])
        node = node_factory(empty, **start)
        await until(lambda: version_is("1.0.0"), "hosted 1.0.0 after the node restart")
        assert [v for v, _ in step_lines(data)] == ["1.0.0"]
        assert "step hosted/migrate of hosted 1.0.0 ran already; not again" in node.log()
        before = await wait_state(nc, node.name, "hosted/daemon", "running")

        # 5. Upgrade: the new step first, then the new tools; the service is replaced by the new version's.
        deliver(artifacts(tmp_path / "out", "2.0.0", starts), node.name, nats_server.url)
        await until(lambda: version_is("2.0.0"), "hosted 2.0.0 answering")
        lines = step_lines(data)
        assert [v for v, _ in lines] == ["1.0.0", "2.0.0"]
        assert lines[1][1] < float(starts.read_text().splitlines()[-1].split()[0])  # the 2.0.0 tools started after

        async def upgraded() -> dict[str, Any] | None:
            b = await wait_state(nc, node.name, "hosted/daemon", "running")
            return b if (data / "beat-2.0.0").exists() and b["pid"] != before["pid"] else None

        v2 = await until(upgraded, "the daemon of 2.0.0 running")
        await until(lambda: beating(data, "2.0.0", v2["pid"]), "the 2.0.0 daemon's beat")
        assert not alive(before["pid"])
        tools_v2 = await wait_state(nc, node.name, "hosted/tools", "ready")

        # 6. A failing step refuses 3.0.0, named; 2.0.0 keeps serving, nothing of it restarted.
        deliver(artifacts(tmp_path / "out", "3.0.0", starts, step_env=', STEP_FAIL = "1"'), node.name, nats_server.url)

        async def refused() -> list[str]:
            return [p for p in (await status(nc, node.name))["problems"] if "3.0.0" in p]

        [problem] = await until(refused, "3.0.0 refused")
        assert "step hosted/migrate of hosted 3.0.0 failed: exit code 3" in problem, problem
        assert "migration 3.0.0 failed: column x already exists" in problem, problem
        assert await version_is("2.0.0")
        assert (await wait_state(nc, node.name, "hosted/tools", "ready"))["pid"] == tools_v2["pid"]
        assert (await wait_state(nc, node.name, "hosted/daemon", "running"))["pid"] == v2["pid"]
        assert not (data / "beat-3.0.0").exists()
        assert [v for v, _ in step_lines(data)] == ["1.0.0", "2.0.0", "3.0.0"]  # tried once, failed
        assert not (node.state_dir / "steps" / "hosted" / "migrate@3.0.0.json").exists()

        # 7. Removed: the service stops with the module; no process of the module is left.
        r = subprocess.run(
            [*MESHCTL, "bundle", "remove", "hosted", "--node", node.name, "--nats", nats_server.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr

        async def gone() -> bool:
            return not any(b["module"] == "hosted" for b in (await status(nc, node.name))["bundles"])

        await until(gone, "hosted removed")

        async def no_process_left() -> bool:
            return module_processes(node.name, "hosted") == []

        await until(no_process_left, "no process of hosted left", timeout=10)
        assert not alive(v2["pid"]) and not alive(tools_v2["pid"])
    finally:
        await nc.close()


def test_a_step_past_its_timeout_refuses_the_module_served_from_source(tmp_path: Path, node_factory) -> None:
    mods = tmp_path / "mods"
    folder = module_source(mods / "hosted")
    (tmp_path / "starts").mkdir()
    text = manifest("1.0.0", tmp_path / "starts" / "starts.log", step_env=', STEP_SLEEP = "30"', step_timeout_ms=1000)
    (folder / "module.toml").write_text(text.replace('source = "src"', 'source = "."'))
    started = time.monotonic()
    node = node_factory(mods, name=f"timeout-{os.getpid()}", config=NODE_RUNS_SERVICES)

    async def check() -> None:
        nc = await client(node.bus_url())
        try:
            st = await status(nc, node.name)
        finally:
            await nc.close()
        [problem] = st["problems"]
        assert "step hosted/migrate of hosted 1.0.0 failed: timed out after 1 s (killed)" in problem, problem
        assert "migrating 1.0.0" in problem  # its last output, named
        assert st["bundles"] == [] and st["modules"] == []  # neither its tools nor its service started

    asyncio.run(check())
    assert time.monotonic() - started < 15
    assert module_processes(node.name, "hosted") == []  # the step was killed with its group
    assert not (node.state_dir / "steps" / "hosted").exists()


@pytest.mark.toolchain("go")
def test_hello_service_runs_from_source_and_stops_with_the_node(tmp_path: Path, node_factory) -> None:
    if shutil.which("go") is None:
        pytest.fail("go is not installed: run scripts/setup.sh (the Go toolchain builds hello-service)")
    mods = tmp_path / "mods"
    shutil.copytree(ROOT / "bundles" / "hello-service", mods / "hello-service")
    node = node_factory(mods, name=f"hello-service-{os.getpid()}", config=NODE_RUNS_SERVICES)
    heartbeat = node.state_dir / "data" / "hello-service" / "heartbeat.json"

    async def running() -> dict[str, Any]:
        nc = await client(node.bus_url())
        try:
            return await wait_state(nc, node.name, "hello-service/daemon", "running", timeout=300)
        finally:
            await nc.close()

    daemon = asyncio.run(running())
    assert (daemon["kind"], daemon["language"], daemon["runs"]) == ("service", "go", "node")
    deadline = time.monotonic() + 10
    beat: dict[str, Any] = {}
    while time.monotonic() < deadline:
        beat = json.loads(heartbeat.read_text()) if heartbeat.exists() else {}
        if beat.get("beats", 0) >= 2:
            break
        time.sleep(0.2)
    assert beat["pid"] == daemon["pid"] and beat["bundle"] == "hello-service/daemon" and beat["node"] == node.name
    assert beat["beats"] >= 2 and not beat["stopped"]
    assert node.terminate() == 0
    final = json.loads(heartbeat.read_text())
    assert final["stopped"] is True  # it got SIGTERM and stopped cleanly, not a SIGKILL
    assert not alive(daemon["pid"])


# --- who runs services -------------------------------------------------------------------------
def test_the_host_is_systemd_only_where_systemd_runs_the_node_and_units_can_be_written(tmp_path: Path) -> None:
    booted, units = tmp_path / "run-systemd-system", tmp_path / "units"
    units.mkdir()
    auto = ServicesConfig(unit_dir=str(units))
    by_systemd = {"INVOCATION_ID": "0123abcd"}  # what systemd sets in every unit's environment
    no_systemd = choose_host(auto, systemd_dir=str(booted), environ=by_systemd)
    assert no_systemd.runs == "node" and "systemd does not run this machine" in no_systemd.reason
    booted.mkdir()
    by_hand = choose_host(auto, systemd_dir=str(booted), environ={})
    assert by_hand.runs == "node" and "not started by systemd" in by_hand.reason
    if shutil.which("systemctl"):
        assert choose_host(auto, systemd_dir=str(booted), environ=by_systemd).runs == "systemd"
    if os.geteuid() != 0:  # root writes anywhere: the unwritable folder says nothing then
        units.chmod(0o500)
        assert choose_host(auto, systemd_dir=str(booted), environ=by_systemd).runs == "node"
    forced = ServicesConfig(host="node", unit_dir=str(units))
    assert choose_host(forced, systemd_dir=str(booted), environ=by_systemd).runs == "node"
    assert NodeConfig().services.host == "auto" and NodeConfig().services.unit_dir == "/run/systemd/system"


def test_services_run_as_systemd_units_where_systemd_is_pid_1(tmp_path: Path) -> None:
    """The node writes, starts, reads and removes a real unit: only where systemd runs the machine."""
    if not os.path.isdir("/run/systemd/system") or os.geteuid() != 0:
        comm = Path("/proc/1/comm").read_text().strip()
        pytest.skip(
            f"systemd does not run this machine (PID 1 is {comm}) or the tests are not root: the node's "
            "systemctl daemon-reload/restart/show/stop of a service unit was NOT exercised here; the units it "
            "writes are checked with systemd-analyze verify in tests/test_units.py"
        )
    from manifests import load_module
    from runtime.hosting.placement import from_source
    from runtime.hosting.services import SystemdService

    folder = module_source(tmp_path / "hosted")
    (folder / "module.toml").write_text(manifest("1.0.0", tmp_path / "s.log").replace('source = "src"', 'source = "."'))
    placement = from_source(load_module(folder))
    spec = next(b for b in placement.loaded.module.bundle if b.kind == "service")
    config = NodeConfig(
        name="unit-test", state_dir=str(tmp_path / "state"), services=ServicesConfig(unit_dir="/run/systemd/system")
    )

    async def run() -> None:
        service = SystemdService(placement, spec, config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.run)
            deadline = time.monotonic() + 30
            while service.state != "running" and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert service.state == "running" and service.pid and alive(service.pid)
            assert service.status().runs == "systemd"
            pid = service.pid
            await service.stop()
        assert not service.path.exists() and not alive(pid)

    asyncio.run(run())


def now(check: Any) -> Any:
    """`until` for a plain (not awaitable) check."""

    async def checked() -> Any:
        return check()

    return checked


ESCAPE = (
    # A grandchild that leaves the group (setsid) with an empty environment (no run marker): only
    # a cgroup catches it. Its pid is written where the test reads it.
    'setsid env -i sh -c \'echo $$ > "$1"; exec sleep 60\' sh "$1" </dev/null >/dev/null 2>&1 & exec sleep 60'
)


async def test_a_service_and_a_step_the_node_runs_get_a_cgroup_each_killed_at_their_end(tmp_path: Path) -> None:
    """harden-child's cgroup per runner holds for services and steps too (the shared loop)."""
    from launcher.cgroup import members
    from launcher.process import ChildSpec
    from launcher.reaper import Reaper
    from launcher.restart import RestartPolicy
    from launcher.service import ServiceRunner, ServiceSpec
    from launcher.step import run_step

    reaper = Reaper(f"svc-cgroup-{os.getpid()}-{time.monotonic_ns()}")
    await reaper.start()
    try:
        if reaper.cgroups is None:
            pytest.skip(f"this machine gives a child no cgroup ({reaper.no_cgroups_because}): NOT exercised here")

        def escaping(name: str) -> ChildSpec:
            return ChildSpec(argv=["/bin/sh", "-c", ESCAPE, "sh", str(tmp_path / name)], cwd=str(tmp_path), env={})

        old = ServiceRunner(ServiceSpec("m", "daemon", "sh", escaping("old"), RestartPolicy(), 0.5), reaper=reaper)
        new = ServiceRunner(ServiceSpec("m", "daemon", "sh", escaping("new"), RestartPolicy(), 0.5), reaper=reaper)
        async with anyio.create_task_group() as tg:
            tg.start_soon(old.run)
            tg.start_soon(new.run)  # the same bundle twice, as during an in-place upgrade
            await until(now(lambda: (tmp_path / "old").exists() and (tmp_path / "new").exists()), "both escapees")
            old_escapee, new_escapee = (int((tmp_path / n).read_text()) for n in ("old", "new"))
            assert old._child_spec is not None and new._child_spec is not None
            old_cgroup, new_cgroup = old._child_spec.cgroup, new._child_spec.cgroup
            assert old_cgroup and new_cgroup and old_cgroup != new_cgroup  # one per runner
            assert old_escapee in members(old_cgroup) and old.pid in members(old_cgroup)
            await old.stop()
            await old.finished.wait()
            await until(now(lambda: not alive(old_escapee)), "the old runner's escapee killed with its cgroup", 5)
            assert members(old_cgroup) == []
            assert alive(new_escapee) and new.state == "running"  # the other runner's child untouched
            await new.stop()
        await until(now(lambda: not alive(new_escapee)), "the new runner's escapee killed", 5)

        outcome = await run_step("m", "migrate", escaping("step"), 0.5, reaper=reaper, stop_grace_s=0.2)
        assert not outcome.ok and outcome.exit.startswith("timed out")
        step_escapee = int((tmp_path / "step").read_text())
        await until(now(lambda: not alive(step_escapee)), "the step's escapee killed with its cgroup", 5)
    finally:
        await reaper.close()
    assert reaper.cgroups is not None and not reaper.cgroups.base.exists()  # the run's cgroups gone with it
