"""Issue 24, phase 2: a real node confines every child it starts, by default, from the manifest alone.

Two hostile modules (tests/children/sandbox-probe: `probe` in Python, `probe-c` in C built from
source by the node), each a tools bundle, a service and a step, served by `meshctl node run`
with nothing but their module.toml (no confinement asked for: it is the default). Each child
tries, by absolute path, to read the node's own bus.json, its mesh password file and another
module's data file; to write beside the bundle folders, under /tmp and into the other module's
data folder; to connect to the bus's port and to a port it did not declare; to ptrace and to
signal the node (its parent). And what it may: read its own bundle file, write its own data
folder, connect to the port it declared. The tools answer a call; the service and the step write
their outcomes into their data folder. Every network target is a port on 127.0.0.1 that this
test listens on (the bus's is the node's embedded server).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import nats
import pytest

from launcher import sandbox
from launcher.sandbox import Confinement, Limits
from runtime.bus.embedded import free_port
from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, NodeProcess, call, status, wait_for, wait_state

PROBE = Path(__file__).resolve().parent / "children" / "sandbox-probe"
pytestmark: list[pytest.MarkDecorator] = [pytest.mark.slow]
SUPPORT = sandbox.support()
if SUPPORT.helper is None or SUPPORT.landlock_abi < sandbox.LANDLOCK_SCOPE_ABI:
    _here = sandbox.describe(Confinement(bundle_dir="/", data_dir="/", tmp_dir="/"), SUPPORT)
    pytestmark.append(pytest.mark.skip(reason=f"no full confinement here: {_here}"))

# The services run by the node itself; a first start may wait on the C builds.
CONFIG = FAST_CONFIG.replace("init_timeout_s = 2\n", "init_timeout_s = 20\n") + '\n[services]\nhost = "node"\n'
MODULES = {"probe": ("python", ["python", "main.py"]), "probe-c": ("c", ["bin/sandbox-probe-c"])}
KINDS = {"tools": ("tools", []), "daemon": ("service", ["serve"]), "migrate": ("step", ["once"])}


@pytest.fixture
def listening() -> Iterator[tuple[int, int]]:
    """(declared, undeclared): two ports this test listens on."""
    sockets = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        sockets.append(s)
    yield sockets[0].getsockname()[1], sockets[1].getsockname()[1]
    for s in sockets:
        s.close()


def manifest(module: str, language: str, entry: list[str], declared: int, args: dict[str, Any]) -> str:
    lines = [f'name = "{module}"', 'version = "1.0.0"']
    for bundle, (kind, more) in KINDS.items():
        lines += [
            "",
            "[[bundle]]",
            f'name = "{bundle}"',
            f'kind = "{kind}"',
            f'language = "{language}"',
            f'source = "{language}"',
            f"entry = {json.dumps(entry + more)}",
            f'network = ["127.0.0.1:{declared}"]',
            f"env = {{ PROBE_ARGS = {json.dumps(json.dumps(args))} }}",
        ]
    return "\n".join(lines) + "\n"


def check(found: dict[str, Any], where: str, *, module: str, bundle: str, state: Path, room: dict[str, Any]) -> None:
    """Every outcome as declared, for the child of `module`/`bundle`."""
    said = f"{where}: {json.dumps(found)}"
    for path in room["secrets"]:
        assert found["read"][path] == "EACCES", said
    for other in MODULES:  # another module's source folder: not this child's to read
        if other != module:
            assert found["read"][room["sources"][other]] == "EACCES", said
    assert found["read_own"] == "ok", said
    for path in room["outside"]:
        assert found["write"][path] == "EACCES", said
        assert not Path(path).exists(), path
    for other, path in room["data"].items():
        assert found["write"][path] == ("ok" if other == module else "EACCES"), said
    assert (state / "data" / module / "probe.txt").read_text() == "was here\n"
    connect = found["connect"]
    assert connect[str(room["declared"])] == "ok", said
    assert connect[str(room["bus"])] == "EACCES", said  # Landlock's TCP rule
    assert connect[str(room["undeclared"])] == "EACCES", said
    assert found["ptrace"] == "EPERM" and found["signal"] == "EPERM", said
    limits = Limits()
    assert found["limits"]["nofile"] == limits.max_open_files and found["limits"]["core"] == 0, said
    assert found["limits"]["data"] == limits.max_memory_mb * 1024 * 1024, said
    assert found["tmpdir"] == str(state / "tmp" / f"{module}.{bundle}"), said
    if "capabilities" in found:
        assert int(found["capabilities"], 16) == 0, said


async def test_every_kind_of_bundle_in_each_language_is_confined_by_the_node(
    tmp_path: Path, node_factory, listening: tuple[int, int]
) -> None:
    declared, undeclared = listening
    bus = free_port()
    name = f"sandboxed-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex
    # A first run makes the state folder's secrets (bus.json, the bus's passwords), as any node's.
    empty = tmp_path / "empty"
    empty.mkdir()
    first = NodeProcess(tmp_path, empty, None, name, config=CONFIG, extra_args=["--embedded-port", str(bus)])
    first.wait_log("serving on", timeout=60)
    first.proc.terminate()
    first.proc.wait(30)
    state = first.state_dir
    (state / "data" / "other").mkdir(parents=True)
    (state / "data" / "other" / "store.sqlite").write_text("alice's private memory")
    for module in MODULES:  # both data folders there from the start: a write into the other's is refused, not ENOENT
        (state / "data" / module).mkdir(mode=0o700)
    mods = tmp_path / "mods"
    room: dict[str, Any] = {
        "secrets": [str(state / "bus.json"), str(state / "bus-mesh.password"), str(state / "data/other/store.sqlite")],
        "sources": {
            "probe": str(mods / "probe" / "python" / "main.py"),
            "probe-c": str(mods / "probe-c" / "c" / "probe.c"),
        },
        "outside": [str(mods / m / "beside-the-bundle.txt") for m in MODULES] + [f"/tmp/mesh-sandbox-node-{tag}.txt"],
        "data": {m: str(state / "data" / m / "probe.txt") for m in MODULES},
        "declared": declared,
        "undeclared": undeclared,
        "bus": bus,
    }
    assert all(Path(p).is_file() for p in room["secrets"]), room["secrets"]
    args = {
        "read": [*room["secrets"], *room["sources"].values()],
        "write": [*room["outside"], *room["data"].values()],
        "connect": [bus, undeclared, declared],
        "read_own": "main.py",
        "read_own_c": "bin/sandbox-probe-c",
        "ptrace": "parent",
        "signal": "parent",
    }
    for module, (language, entry) in MODULES.items():
        shutil.copytree(PROBE / language, mods / module / language)
        (mods / module / "module.toml").write_text(manifest(module, language, entry, declared, args))

    node = node_factory(mods, url=None, name=name, config=CONFIG, extra_args=["--embedded-port", str(bus)])
    # The embedded bus takes no anonymous client: status in the mesh account, calls as the operator.
    url = node.bus_url()
    nc = await nats.connect(url, user="mesh-node", password=(state / "bus-mesh.password").read_text().strip())
    local = await nats.connect(url, user="mesh-local", password=(state / "bus-local.password").read_text().strip())
    try:
        line = f"landlock v{SUPPORT.landlock_abi} + seccomp + tcp {declared}"
        for module in MODULES:
            tools = await wait_state(nc, node.name, f"{module}/tools", "ready", timeout=120)
            daemon = await wait_state(nc, node.name, f"{module}/daemon", "running", timeout=60)
            assert tools["confinement"] == line and daemon["confinement"] == line, (tools, daemon)
            code, result = await call(local, f"mesh.tool.{module}.attempt", {"arguments": json.dumps(args)}, timeout=30)
            assert code == 200 and not result.get("isError"), result
            check(
                json.loads(result["content"][0]["text"]),
                f"{module}/tools",
                module=module,
                bundle="tools",
                state=state,
                room=room,
            )
            for bundle in ("daemon", "migrate"):
                report = state / "data" / module / f"report-{bundle}.json"
                await wait_for(report.is_file, f"{module}/{bundle}'s report", timeout=30)
                found = json.loads(report.read_text())
                check(found, f"{module}/{bundle}", module=module, bundle=bundle, state=state, room=room)
        body = await status(nc, node.name)
        assert body["sandbox"] == f"landlock v{SUPPORT.landlock_abi} + seccomp", body["sandbox"]
    finally:
        await nc.close()
        await local.close()
    # What the operator sees: the node's line and each bundle's column.
    shown = subprocess.run(
        [*MESHCTL, "node", "status", "--name", node.name, "--state-dir", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert f"sandbox: landlock v{SUPPORT.landlock_abi} + seccomp" in shown.stdout, shown.stdout + shown.stderr
    assert "CONFINEMENT" in shown.stdout and shown.stdout.count(f"+ tcp {declared}") == 4, shown.stdout
