"""Issue 24, phase 1: a confined child, through the launcher, tries to leave its sandbox.

tests/children/sandbox-probe is a hostile bundle on purpose (Python on the mesh SDK, and C on
the C SDK): its tool tries to read a fake node state folder (bus.json, the mesh password file,
another module's data file) by absolute path, to write beside its own bundle folder and under
/tmp, to connect to the "bus" port and another port it did not declare, to connect to a unix
socket, to ptrace and to signal the node (this test process); and what it may do: read its own
bundle, write its data folder and its TMPDIR, connect to a declared port. Every outcome is the
kernel's answer, checked as declared, for a tools bundle (BundleRunner), a service
(ServiceRunner) and a step (run_step). Every network target is a port on 127.0.0.1 that this
test listens on; the unix socket is this test's own too.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import anyio
import pytest

from launcher import sandbox
from launcher.bundle import BundleRunner, HealthPolicy, RunnerSpec
from launcher.process import ChildSpec, use_pidfd_child_watcher
from launcher.restart import RestartPolicy
from launcher.sandbox import Confinement, Endpoint, Limits
from launcher.service import ServiceRunner, ServiceSpec
from launcher.step import run_step
from manifests import load_module
from tests.support.fake_child import FAST_RESTART
from tests.support.sdk import require
from toolchains.build import stage_bundle
from toolchains.c import CToolchain

PROBE = Path(__file__).resolve().parent / "children" / "sandbox-probe"
pytestmark: list[pytest.MarkDecorator] = [pytest.mark.slow]
SUPPORT = sandbox.support()
if SUPPORT.helper is None or SUPPORT.landlock_abi < sandbox.LANDLOCK_SCOPE_ABI:
    # Said, never silent: this file checks the full confinement and needs the kernel for it.
    _here = sandbox.describe(Confinement(bundle_dir="/", data_dir="/", tmp_dir="/"), SUPPORT)
    pytestmark.append(pytest.mark.skip(reason=f"no full confinement here: {_here}"))
DEFAULT_LIMITS = Limits()

DENIED_FILE = "EACCES"  # Landlock refuses a path outside the sandbox
DENIED_CALL = "EPERM"  # the seccomp filter, or Landlock's scopes (signals)


@dataclass
class Room:
    """A fake node's state folder, the probe's folders, and the ports this test listens on."""

    root: Path
    state: Path
    bundle: Path
    bus_port: int
    other_port: int
    declared_port: int
    unix_socket: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)  # names the file it tries to write in /tmp

    @property
    def data(self) -> Path:
        return self.state / "data" / "sandbox-probe"

    @property
    def tmp(self) -> Path:
        return self.state / "tmp" / "sandbox-probe.tools"

    def secrets(self) -> list[str]:
        return [
            str(self.state / "bus.json"),
            str(self.state / "bus-mesh.password"),
            str(self.state / "data" / "other" / "store.sqlite"),
        ]

    def own_file(self) -> str:
        return str(next(p for p in sorted(self.bundle.rglob("*")) if p.is_file()))

    def outside_writes(self) -> list[str]:
        return [str(self.bundle.parent / "beside-the-bundle.txt"), f"/tmp/mesh-sandbox-test-{self.tag}.txt"]

    def inside_writes(self) -> list[str]:
        return [str(self.data / "probe.txt"), str(self.tmp / "scratch.txt")]

    def arguments(self) -> dict[str, Any]:
        return {
            "read": [*self.secrets(), self.own_file()],
            "write": [*self.outside_writes(), *self.inside_writes()],
            "connect": [self.bus_port, self.other_port, self.declared_port],
            "unix": [str(self.unix_socket)],
            "ptrace": os.getpid(),
            "signal": os.getpid(),
        }

    def confinement(self, *, network: bool, limits: Limits = DEFAULT_LIMITS) -> Confinement:
        return Confinement(
            bundle_dir=str(self.bundle),
            data_dir=str(self.data),
            tmp_dir=str(self.tmp),
            runtime=sandbox.program_paths(sys.executable),
            network=(Endpoint("127.0.0.1", self.declared_port),) if network else (),
            limits=limits,
        )


def _listen() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    sockets = [_listen() for _ in range(3)]
    yield sockets
    for s in sockets:
        s.close()


def _room(root: Path, bundle: Path, listening: list[socket.socket]) -> Room:
    state = root / "state"
    (state / "data" / "other").mkdir(parents=True)
    (state / "bus.json").write_text('{"url": "nats://127.0.0.1:4222"}')
    (state / "bus-mesh.password").write_text("the mesh's own password")
    (state / "data" / "other" / "store.sqlite").write_text("alice's private memory")
    unix = root / "node.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(unix))
    server.listen(1)
    listening.append(server)  # closed with the others
    bus, other, declared = (s.getsockname()[1] for s in listening[:3])
    return Room(root, state, bundle, bus, other, declared, unix)


@pytest.fixture
def room(tmp_path: Path, listening: list[socket.socket]) -> Room:
    bundle = tmp_path / "bundles" / "sandbox-probe" / "python"
    shutil.copytree(PROBE / "python", bundle)
    return _room(tmp_path, bundle, listening)


@pytest.fixture(scope="module")
def c_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(CToolchain())
    loaded = load_module(PROBE)
    bundle = next(b for b in loaded.module.bundle if b.language == "c")
    stage = tmp_path_factory.mktemp("c-probe") / "bundle"
    stage.mkdir()
    stage_bundle(loaded, bundle, stage, progress=lambda _: None)
    return stage


@pytest.fixture
def c_room(tmp_path: Path, c_probe: Path, listening: list[socket.socket]) -> Room:
    bundle = tmp_path / "bundles" / "sandbox-probe" / "c"
    shutil.copytree(c_probe, bundle)
    return _room(tmp_path, bundle, listening)


def check(room: Room, found: dict[str, Any], *, network: bool, limits: Limits = DEFAULT_LIMITS) -> None:
    """Every outcome as declared."""
    print(json.dumps(found, indent=1))
    for path in room.secrets():
        assert found["read"][path] == DENIED_FILE, path
    assert found["read"][room.own_file()] == "ok"
    for path in room.outside_writes():
        assert found["write"][path] == DENIED_FILE, path
        assert not Path(path).exists()
    for path in room.inside_writes():
        assert found["write"][path] == "ok", path
        assert Path(path).read_text() == "was here\n"
    connect = found["connect"]
    if network:
        assert connect[str(room.declared_port)] == "ok"
        assert connect[str(room.bus_port)] == DENIED_FILE  # Landlock's TCP rule: EACCES
        assert connect[str(room.other_port)] == DENIED_FILE
    else:
        assert set(connect.values()) == {DENIED_CALL}, connect  # no inet socket at all
    assert found["unix"][str(room.unix_socket)] == DENIED_CALL
    assert found["ptrace"] == DENIED_CALL
    assert found["signal"] == DENIED_CALL
    assert found["limits"]["nofile"] == limits.max_open_files
    assert found["limits"]["data"] == limits.max_memory_mb * 1024 * 1024
    assert found["limits"]["core"] == 0
    assert found["tmpdir"] == str(room.tmp)
    if "capabilities" in found:
        assert int(found["capabilities"], 16) == 0  # a root node's child keeps no capability


def python_child(room: Room, *, network: bool, argv: list[str] | None = None, **more: Any) -> ChildSpec:
    env = {"PATH": "/usr/bin:/bin", "PROBE_ARGS": json.dumps(room.arguments())}
    return ChildSpec(
        argv=[sys.executable, "main.py", *(argv or [])],
        cwd=str(room.bundle),
        env=env,
        confinement=room.confinement(network=network, **more),
    )


def c_child(room: Room, *, network: bool, argv: list[str] | None = None) -> ChildSpec:
    env = {"PATH": "/usr/bin:/bin", "PROBE_ARGS": json.dumps(room.arguments())}
    return ChildSpec(
        argv=[str(room.bundle / "bin" / "sandbox-probe-c"), *(argv or [])],
        cwd=str(room.bundle),
        env=env,
        confinement=room.confinement(network=network),
    )


async def call_attempt(child: ChildSpec, arguments: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Start a tools runner on `child`, call its `attempt` tool once, stop it."""
    use_pidfd_child_watcher()
    runner = BundleRunner(
        RunnerSpec(
            module="sandbox-probe",
            name="tools",
            language="python",
            child=child,
            timeout_ms=20_000,
            max_in_flight=4,
            restart=FAST_RESTART,
            health=HealthPolicy(init_timeout_s=20, stop_grace_s=0.5),
        )
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        with anyio.fail_after(30):
            while runner.state != "ready":
                assert runner.state not in ("failed", "backoff"), (runner.last_error, list(runner.stderr_tail))
                await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        pending = runner.begin(
            b'"attempt"', json.dumps({"arguments": json.dumps(arguments)}).encode(), loop.time() + 20
        )
        assert pending is not None
        result = json.loads(bytes(await runner.finish(pending)))
        status = runner.status()
        await runner.stop()
    assert not result.get("isError"), result
    return json.loads(result["content"][0]["text"]), status.confinement


@pytest.mark.parametrize("network", [False, True], ids=["no-network", "one-declared-port"])
async def test_a_python_tools_bundle_gets_every_outcome_as_declared(room: Room, network: bool) -> None:
    found, confinement = await call_attempt(python_child(room, network=network), room.arguments())
    check(room, found, network=network)
    assert confinement.startswith(f"landlock v{SUPPORT.landlock_abi} + seccomp + ")
    assert confinement.endswith(f"tcp {room.declared_port}" if network else "netns"), confinement


@pytest.mark.toolchain("c")
@pytest.mark.parametrize("network", [False, True], ids=["no-network", "one-declared-port"])
async def test_a_c_tools_bundle_gets_every_outcome_as_declared(c_room: Room, network: bool) -> None:
    found, _ = await call_attempt(c_child(c_room, network=network), c_room.arguments())
    check(c_room, found, network=network)


async def test_a_step_gets_every_outcome_as_declared(room: Room) -> None:
    outcome = await run_step("sandbox-probe", "migrate", python_child(room, network=True, argv=["once"]), 30)
    assert outcome.ok, outcome
    check(room, json.loads(outcome.output_tail[-1]), network=True)
    assert outcome.confinement == f"landlock v{SUPPORT.landlock_abi} + seccomp + tcp {room.declared_port}"


@pytest.mark.toolchain("c")
async def test_a_compiled_step_gets_every_outcome_as_declared(c_room: Room) -> None:
    outcome = await run_step("sandbox-probe", "migrate", c_child(c_room, network=False, argv=["once"]), 30)
    assert outcome.ok, outcome
    check(c_room, json.loads(outcome.output_tail[-1]), network=False)


async def test_a_service_gets_every_outcome_as_declared(room: Room) -> None:
    use_pidfd_child_watcher()
    runner = ServiceRunner(
        ServiceSpec(
            "sandbox-probe", "daemon", "python", python_child(room, network=False, argv=["serve"]), RestartPolicy(), 0.5
        )
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        with anyio.fail_after(30):
            while not any(line.startswith("{") for line in runner.stderr_tail):
                assert runner.state != "failed", runner.last_error
                await asyncio.sleep(0.05)
        line = next(line for line in runner.stderr_tail if line.startswith("{"))
        status = runner.status()
        await runner.stop()
    check(room, json.loads(line), network=False)
    assert status.kind == "service" and status.confinement.endswith("netns")


async def test_the_manifest_limits_reach_the_child_and_memory_past_its_bound_fails(room: Room) -> None:
    limits = Limits(max_memory_mb=256, max_processes=32, max_open_files=64)
    arguments = {**room.arguments(), "memory_mb": 512}
    spec = python_child(room, network=False, argv=["once"], limits=limits)
    spec = ChildSpec(
        argv=spec.argv,
        cwd=spec.cwd,
        env={**spec.env, "PROBE_ARGS": json.dumps(arguments)},
        confinement=spec.confinement,
    )
    outcome = await run_step("sandbox-probe", "limits", spec, 30)
    assert outcome.ok, outcome
    found = json.loads(outcome.output_tail[-1])
    check(room, found, network=False, limits=limits)
    assert found["memory"] == "MemoryError"  # RLIMIT_DATA: 512 MB past a 256 MB bound


async def test_a_required_confinement_the_machine_lacks_is_refused_not_run_unconfined(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = sandbox.Support(SUPPORT.helper, 0, SUPPORT.userns, SUPPORT.netns, SUPPORT.seccomp, SUPPORT.as_root)
    monkeypatch.setitem(sandbox._supported, (None, None), without)
    outcome = await run_step("sandbox-probe", "migrate", python_child(room, network=False, argv=["once"]), 30)
    assert not outcome.ok and "cannot be confined: the kernel has no Landlock" in outcome.exit
    assert outcome.confinement.startswith("refused: the kernel has no Landlock")
    assert not (room.data / "probe.txt").exists()  # it never ran


@pytest.mark.toolchain("c")
async def test_a_child_run_as_another_user_gets_a_user_namespace_and_its_own_process_count(
    c_probe: Path, listening: list[socket.socket]
) -> None:
    """child_user: the helper runs after the uid changed, so it makes a user namespace mapping
    the uid to itself (for the network namespace, and so RLIMIT_NPROC counts this child only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as nobody: NOT exercised here")
    root = Path(tempfile.mkdtemp(prefix="mesh-sandbox-user-"))  # outside pytest's 0700 folder: nobody must reach it
    try:
        os.chmod(root, 0o755)
        bundle = root / "bundles" / "sandbox-probe" / "c"
        shutil.copytree(c_probe, bundle)
        shutil.chown(bundle.parent, "nobody")  # its parent is nobody's: the "beside" write is Landlock's to refuse
        r = _room(root, bundle, listening)
        for folder in (r.state, r.state / "data"):
            os.chmod(folder, 0o755)
        os.chmod(r.state / "bus.json", 0o644)  # readable by nobody's permissions: Landlock refuses it
        spec = c_child(r, network=False, argv=["once"])
        spec = ChildSpec(argv=spec.argv, cwd=spec.cwd, env=spec.env, user="nobody", confinement=spec.confinement)
        outcome = await run_step("sandbox-probe", "as-nobody", spec, 30)
        assert outcome.ok, outcome
        found = json.loads(outcome.output_tail[-1])
        assert found["read"][str(r.state / "bus.json")] == DENIED_FILE
        assert found["write"][str(r.data / "probe.txt")] == "ok"  # its data folder was made for nobody
        assert found["limits"]["nproc"] == Limits().max_processes  # applied: counted in its own namespace
        assert set(found["connect"].values()) == {DENIED_CALL}
        assert found["ptrace"] == DENIED_CALL and found["signal"] == DENIED_CALL
        assert sandbox.support("nobody").userns
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_the_control_unconfined_the_same_probe_reads_and_reaches_everything(room: Room) -> None:
    """Without a confinement the very same attempts succeed: each refusal above is the sandbox's."""
    arguments = {k: v for k, v in room.arguments().items() if k != "ptrace"}  # it would stop this very process
    room.data.mkdir(parents=True)  # made by the launcher for a confined child only
    room.tmp.mkdir(parents=True)
    spec = ChildSpec(
        argv=[sys.executable, "main.py", "once"],
        cwd=str(room.bundle),
        env={"PATH": "/usr/bin:/bin", "PROBE_ARGS": json.dumps(arguments)},
    )
    outcome = await run_step("sandbox-probe", "control", spec, 30)
    found = json.loads(outcome.output_tail[-1])
    assert all(found["read"][p] == "ok" for p in room.secrets())
    assert all(v == "ok" for v in found["write"].values())
    assert all(v == "ok" for v in found["connect"].values())
    assert found["unix"][str(room.unix_socket)] == "ok"
    assert found["signal"] == "ok"
    assert outcome.confinement == "none: not asked for"
    for path in room.outside_writes():
        Path(path).unlink(missing_ok=True)
