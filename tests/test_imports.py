"""Published MCP servers as bundles: `meshctl module import` from npm, PyPI and the Go module proxy,
built, delivered to a node over the bus and called; reproducible; a missing version writes nothing.

Offline: scripts/setup-imports.sh fetched the packages of tests/data/imports.txt into
.cache/packages (and Go's module cache); every import and build here runs with MESH_OFFLINE=1.
"""

from __future__ import annotations

import asyncio
import filecmp
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from runtime.client import MeshClient, ProgressFrame, tool_result
from tests.support.mesh import MESHCTL, ROOT, call, client, status, wait_state
from tests.test_delivery import wait_call
from toolchains.artifact import read_meta

pytestmark = pytest.mark.slow

EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31"
TIME = "pypi:mcp-server-time==2026.10.19"
GO_MEMORY = "go:github.com/modelcontextprotocol/go-sdk/examples/server/memory@v1.8.0"
NAMES = {EVERYTHING: "everything", TIME: "time", GO_MEMORY: "go-memory"}
SERVER_ARGS = {EVERYTHING: ["stdio"]}
CACHE = ROOT / ".cache" / "packages"
# Children here are real servers on a shared machine: give them time to start.
NODE_CONFIG = """
[health]
init_timeout_s = 30
ping_interval_s = 5
ping_timeout_s = 5
"""


def meshctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MESH_PACKAGE_CACHE=str(CACHE), MESH_OFFLINE="1")
    proc = subprocess.run([*MESHCTL, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, f"meshctl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def import_module(spec: str, out: Path) -> Path:
    proc = meshctl("module", "import", spec, "--name", NAMES[spec], "--out", str(out), "--", *SERVER_ARGS.get(spec, []))
    assert "nothing was written" not in proc.stderr
    return out


def build(module: Path, out: Path) -> Path:
    meshctl("bundle", "build", str(module), "--out", str(out))
    (artifact,) = out.glob("*.tar.gz")
    return artifact


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"toolchain missing: `{tool}` is not installed (see scripts/setup.sh)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Path]]]:
    """Each server imported (offline, from the setup's cache) and built once: spec -> (module, artifact)."""
    for tool in ("node", "npm", "go"):
        _need(tool)
    if not CACHE.is_dir():
        pytest.fail(f"{CACHE} is missing: run scripts/setup-imports.sh (scripts/setup.sh runs it)")
    root = tmp_path_factory.mktemp("imports")
    yield {
        spec: (module := import_module(spec, root / NAMES[spec]), build(module, root / f"out-{NAMES[spec]}"))
        for spec in NAMES
    }


def _same_tree(a: Path, b: Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*"))
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*"))
    for rel in files_a:
        if (a / rel).is_file():
            assert filecmp.cmp(a / rel, b / rel, shallow=False), f"{rel} differs between two imports"


def test_each_import_is_a_module_the_check_names_third_party(built: dict[str, tuple[Path, Path]]) -> None:
    for spec, (module, artifact) in built.items():
        lock = json.loads((module / "package" / "mesh-import.json").read_text())
        assert lock["spec"] == spec and lock["fetched"], lock
        assert all(f["hash"] for f in lock["fetched"])  # every fetched file pinned by hash
        proc = meshctl("module", "check", str(module))
        assert f"{module}: ok" in proc.stdout
        assert f"is third-party: the package {spec}" in proc.stdout, proc.stdout
        meta = read_meta(artifact)
        assert meta.entry == lock["entry"]
    everything = json.loads((built[EVERYTHING][0] / "package" / "mesh-import.json").read_text())
    # The entry comes from the package's own `bin`, with the arguments given after --.
    assert everything["entry"] == [
        "node",
        "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        "stdio",
    ]
    # Packed with its production node_modules: no esbuild single file, no dev dependencies.
    files = read_meta(built[EVERYTHING][1]).files
    assert "node_modules/@modelcontextprotocol/server-everything/dist/index.js" in files
    assert not any(p.startswith("node_modules/esbuild/") for p in files)
    # Compiled wheels (pydantic-core): the bundle names the interpreter ABI and platform it needs.
    time_meta = read_meta(built[TIME][1])
    assert (time_meta.python_abi, time_meta.os) == (
        f"cp{sys.version_info.major}{sys.version_info.minor}",
        "linux",
    )
    assert any(p.startswith("_vendor/mcp_server_time/") for p in time_meta.files)
    assert read_meta(built[GO_MEMORY][1]).files.keys() == {"bin/memory"}  # one static binary


def test_two_imports_of_one_spec_give_the_same_bytes(built: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    for spec, (module, artifact) in built.items():
        again = import_module(spec, tmp_path / NAMES[spec])
        _same_tree(module, again)
        rebuilt = build(again, tmp_path / f"out-{NAMES[spec]}")
        assert rebuilt.name == artifact.name
        assert rebuilt.read_bytes() == artifact.read_bytes(), f"{spec}: two builds differ"


@pytest.mark.parametrize(
    "spec",
    [
        "npm:@modelcontextprotocol/server-everything@1999.1.1",
        "pypi:mcp-server-time==1999.1.1",
        "go:github.com/modelcontextprotocol/go-sdk/examples/server/memory@v1999.1.1",
    ],
)
def test_a_version_that_does_not_exist_fails_clearly_and_writes_nothing(spec: str, tmp_path: Path) -> None:
    out = tmp_path / "module"
    proc = meshctl("module", "import", spec, "--out", str(out), check=False)
    assert proc.returncode == 1
    assert (
        f"import of {spec} failed" in proc.stderr and "1999.1.1" in proc.stderr and "nothing was written" in proc.stderr
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_bad_spec_is_refused_before_any_client_runs(tmp_path: Path) -> None:
    for spec, said in (
        ("npm:left-pad@^1.0.0", "is not an exact version"),
        ("pypi:mcp-server-time@1.0", "written with =="),
        ("apt:curl", "not npm:, pypi:, cargo: or go:"),
        ("go:github.com/acme/server@1.0.0", "Go versions start with v"),
    ):
        proc = meshctl("module", "import", spec, "--out", str(tmp_path / "m"), check=False)
        assert proc.returncode == 1 and said in proc.stderr, proc.stderr
        assert not (tmp_path / "m").exists()


async def test_imported_servers_delivered_and_called_over_the_bus(
    built: dict[str, tuple[Path, Path]], tmp_path: Path, node_factory, nats_server
) -> None:
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('["everything/tools"]\nEVERYTHING_TOKEN = "tok-5ecret-value"\n')
    secrets.chmod(0o600)
    empty = tmp_path / "none"
    empty.mkdir()
    node = node_factory(empty, config=f'secrets = "{secrets}"\n' + NODE_CONFIG)
    artifacts = [str(artifact) for _, artifact in built.values()]
    proc = subprocess.run(
        [*MESHCTL, "bundle", "deliver", *artifacts, "--node", node.name, "--nats", nats_server.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    nc = await client(nats_server.url)
    for module in NAMES.values():
        ready = await wait_state(nc, node.name, f"{module}/tools", "ready", timeout=60)
        assert ready["era"] == "handshake" and ready["protocol_version"] == "2025-11-25", ready
    # npm: the reference server's echo, and its long-running tool (steps with progress) to the end.
    code, result = await wait_call(nc, "mesh.tool.everything.echo", {"message": "hi mesh"}, lambda r: r[0] == 200)
    assert result["content"][0]["text"] == "Echo: hi mesh"
    # Asked with progress over the bus (the call protocol): the child's notifications/progress
    # come back as progress frames, in order, then the result.
    seen: list[ProgressFrame] = []
    raw = await MeshClient(nc).call(
        "mesh.tool.everything.trigger-long-running-operation", {"duration": 1, "steps": 4}, on_progress=seen.append
    )
    result = tool_result(raw)
    assert "completed" in result["content"][0]["text"].lower(), result
    assert [f.progress for f in seen] == [1, 2, 3, 4] and {f.total for f in seen} == {4}
    # The secret reached this bundle's environment, from the node's secrets file only.
    code, result = await call(nc, "mesh.tool.everything.get-env", {})
    assert code == 200 and "tok-5ecret-value" in result["content"][0]["text"]
    # PyPI: mcp-server-time from its vendored wheels.
    code, result = await call(nc, "mesh.tool.time.get_current_time", {"timezone": "UTC"}, timeout=20)
    assert code == 200 and not result.get("isError"), result
    assert '"timezone": "UTC"' in result["content"][0]["text"] or "UTC" in json.dumps(result)
    # Go module proxy: the Go SDK's memory server, built from the pinned module into one binary.
    entity = {"name": "mesh", "entityType": "project", "observations": ["serves published servers"]}
    code, result = await call(nc, "mesh.tool.go-memory.create_entities", {"entities": [entity]})
    assert code == 200 and not result.get("isError"), result
    code, result = await call(nc, "mesh.tool.go-memory.read_graph", {})
    assert code == 200 and "serves published servers" in json.dumps(result)
    assert not any(b["last_error"] for b in (await status(nc, node.name))["bundles"])
    await nc.close()
    assert "tok-5ecret-value" not in node.log()  # the value is never logged; its name may be
    assert "EVERYTHING_TOKEN" in node.log()


async def test_an_imported_module_is_served_from_source_by_node_run_manifests(
    built: dict[str, tuple[Path, Path]], tmp_path: Path, node_factory
) -> None:
    # A Python package bundle is built first (its wheels vendored), though Python bundles of
    # one's own run straight from their source folder.
    shutil.copytree(built[TIME][0], tmp_path / "mods" / "time")
    node = node_factory(
        tmp_path / "mods", config=NODE_CONFIG, env={"MESH_PACKAGE_CACHE": str(CACHE), "MESH_OFFLINE": "1"}
    )
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "time/tools", "ready", timeout=120)
    code, result = await call(nc, "mesh.tool.time.get_current_time", {"timezone": "Europe/Paris"}, timeout=20)
    assert code == 200 and "Europe/Paris" in json.dumps(result), result
    await nc.close()


def test_a_javascript_package_installed_by_hand_is_packed_without_esbuild(
    built: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    # The first try: `npm install` of the server into a module folder, entry into
    # node_modules. Its package-lock.json is what gets installed, production dependencies only.
    module = tmp_path / "by-hand"
    (module / "src").mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(built[EVERYTHING][0] / "package" / name, module / "src" / name)
    (module / "module.toml").write_text(
        'name = "by-hand"\nversion = "1.0.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "typescript"\n'
        'source = "src"\nentry = ["node", "node_modules/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]\n'
    )
    files = read_meta(build(module, tmp_path / "out")).files
    assert "node_modules/@modelcontextprotocol/server-everything/dist/index.js" in files
    assert "package-lock.json" in files and not any(p.startswith("node_modules/esbuild/") for p in files)


async def test_a_bundle_for_another_python_is_refused_by_the_node_naming_the_abi(
    tmp_path: Path, node_factory, nats_server
) -> None:
    from tests.support.mesh import RAW_CHILD
    from toolchains.artifact import ArtifactMeta
    from toolchains.pack import pack

    stage = tmp_path / "stage"
    stage.mkdir()
    shutil.copy(RAW_CHILD, stage / "raw_child.py")
    manifest = 'name = "abi"\nversion = "1.0.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "python"\nsource = "src"\nentry = ["python", "raw_child.py"]\n'
    meta = ArtifactMeta(
        module="abi", bundle="tools", version="1.0.0", kind="tools", language="python",
        entry=["python", "raw_child.py"], manifest=manifest, python_abi="cp399",
    )  # fmt: skip
    artifact = pack(stage, meta, tmp_path / "out")
    empty = tmp_path / "none"
    empty.mkdir()
    node = node_factory(empty)
    proc = subprocess.run(
        [*MESHCTL, "bundle", "deliver", str(artifact), "--node", node.name, "--nats", nats_server.url],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    nc = await client(nats_server.url)
    deadline = asyncio.get_running_loop().time() + 20
    problems: list[str] = []
    while asyncio.get_running_loop().time() < deadline:
        problems = (await status(nc, node.name))["problems"]
        if problems:
            break
        await asyncio.sleep(0.1)
    await nc.close()
    assert any("cp399" in p and f"cp{sys.version_info.major}{sys.version_info.minor}" in p for p in problems), problems


def test_no_version_takes_the_newest_and_writes_it_into_the_lock(tmp_path: Path) -> None:
    # Offline, "the newest" is the newest the package cache holds: the setup's pins.
    for spec in (TIME, GO_MEMORY):
        bare = spec.split("==")[0] if "==" in spec else spec.rsplit("@", 1)[0]
        out = tmp_path / NAMES[spec]
        proc = meshctl("module", "import", bare, "--out", str(out))
        assert f"module of {spec}" in proc.stdout
        assert json.loads((out / "package" / "mesh-import.json").read_text())["spec"] == spec
        assert f'ref = "{spec}"' in (out / "module.toml").read_text()


class _Counted(http.server.BaseHTTPRequestHandler):
    """The test's own HTTP server on 127.0.0.1: counts the requests that reach it."""

    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).hits.append(self.path)
        body = b"reached the test's port\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_an_imported_server_reaches_only_what_allow_net_lets_it(
    built: dict[str, tuple[Path, Path]], tmp_path: Path, node_factory
) -> None:
    """server-everything's gzip-file-as-resource fetches a URL: imported without --allow-net it
    cannot reach the test's port (no network at all); imported with --allow-net 127.0.0.1:PORT,
    recorded in its module.toml, it can."""
    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counted)
    port = listener.server_address[1]
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        mods = tmp_path / "mods"
        shutil.copytree(built[EVERYTHING][0], mods / "everything")
        assert "network = []" in (mods / "everything" / "module.toml").read_text()
        proc = meshctl(
            "module", "import", EVERYTHING, "--name", "everything-net", "--out", str(mods / "everything-net"),
            "--allow-net", f"127.0.0.1:{port}", "--", "stdio",
        )  # fmt: skip
        assert f"network: 127.0.0.1:{port}" in proc.stdout
        assert f'network = ["127.0.0.1:{port}"]' in (mods / "everything-net" / "module.toml").read_text()
        node = node_factory(mods, config=NODE_CONFIG, env={"MESH_PACKAGE_CACHE": str(CACHE), "MESH_OFFLINE": "1"})
        nc = await client(node.bus_url())
        shut = await wait_state(nc, node.name, "everything/tools", "ready", timeout=180)
        opened = await wait_state(nc, node.name, "everything-net/tools", "ready", timeout=180)
        assert shut["confinement"].endswith("+ netns"), shut
        assert opened["confinement"].endswith(f"+ tcp {port}"), opened
        url = {"data": f"http://127.0.0.1:{port}/file.txt", "name": "f.gz", "outputType": "resource"}
        code, result = await call(nc, "mesh.tool.everything.gzip-file-as-resource", url, timeout=30)
        assert result.get("isError") or code != 200, result
        assert _Counted.hits == []  # nothing reached the port
        code, result = await call(nc, "mesh.tool.everything-net.gzip-file-as-resource", url, timeout=30)
        assert code == 200 and not result.get("isError"), result
        assert _Counted.hits == ["/file.txt"]
        await nc.close()
    finally:
        listener.shutdown()


def test_allow_net_is_checked_before_anything_is_fetched(tmp_path: Path) -> None:
    proc = meshctl("module", "import", TIME, "--out", str(tmp_path / "m"), "--allow-net", "localhost", check=False)
    assert proc.returncode == 1 and "--allow-net 'localhost'" in proc.stderr and "HOST:PORT" in proc.stderr
    assert not (tmp_path / "m").exists()
