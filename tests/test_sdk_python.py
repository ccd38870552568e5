"""The Python SDK, the hello-python bundle and the Python toolchain, each proven by a real child.

The bundle runs as the runtime runs it: the node's interpreter, cwd = the bundle folder, a
short environment plus MESH_*, MCP as newline-delimited JSON-RPC on stdin/stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import anyio
import pytest

from manifests import load_module
from tests.support.bus_contract import check_progress_and_cancel_over_the_bus
from tests.support.call_contract import CallContractTests, Wire, check_cancel, check_progress, serving
from tests.support.sdk import facts_env
from tests.support.stdio_client import StdioClient
from toolchains.base import BuildContext, BuildFailed, BuildOutput
from toolchains.python import TOOLCHAIN, VENDOR

REPO = Path(__file__).resolve().parent.parent
SDK = REPO / "sdk" / "python"
HELLO = REPO / "bundles" / "hello-python"
SOURCE = HELLO / "src"

# The SDK from this checkout, whether or not scripts/setup-python.sh has installed it.
if str(SDK) not in sys.path:
    sys.path.insert(0, str(SDK))
import mesh_sdk  # noqa: E402
from mesh_sdk.stdio import OPENING_LEAD_LIMIT, PipeReader  # noqa: E402


def mesh_env(tmp_path: Path, bundle_dir: Path, **extra: str) -> dict[str, str]:
    return facts_env("hello-python", bundle_dir, tmp_path / "data" / "hello-python", node="node-a", **extra)


def from_source_env(tmp_path: Path, bundle_dir: Path) -> dict[str, str]:
    # Running from source, the SDK comes from the checkout, as a developer runs it.
    return mesh_env(tmp_path, bundle_dir, PYTHONPATH=str(SDK))


class RawChild:
    """A child driven line by line, for what the blocking client cannot do: many requests at once."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **env}
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"child closed stdout; stderr: {self.proc.stderr.read().decode(errors='replace')}"  # type: ignore[union-attr]
        return json.loads(line)

    def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        self.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            }
        )
        reply = self.read()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def call(self, id: int, name: str, arguments: dict[str, Any]) -> None:
        self.send(
            {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        )

    def close(self) -> float:
        """Close stdin; return how long the child took to exit."""
        assert self.proc.stdin is not None
        start = time.monotonic()
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - start


# --- the bundle from source ------------------------------------------------------------------


def test_hello_python_from_source(tmp_path: Path) -> None:
    env = from_source_env(tmp_path, SOURCE)
    data_dir = Path(env["MESH_DATA_DIR"])
    with StdioClient([sys.executable, "main.py"], cwd=SOURCE, env=env) as child:
        init = child.initialize()
        assert init["protocolVersion"] == "2025-11-25"
        assert init["serverInfo"]["name"] == "hello-python"

        tools = {t["name"]: t for t in child.list_tools()}
        assert set(tools) == {"greet", "echo.say"}
        assert tools["greet"]["inputSchema"]["properties"]["name"]["type"] == "string"
        assert tools["greet"]["inputSchema"]["required"] == ["name"]
        assert tools["greet"]["description"] == "Greet someone by name."
        assert set(tools["greet"]["outputSchema"]["properties"]) == {"greeting", "module", "node"}
        assert tools["echo.say"]["inputSchema"]["properties"]["text"]["type"] == "string"

        greeted = child.call("greet", {"name": "Ann"})
        assert greeted["isError"] is False
        assert greeted["content"] == [{"type": "text", "text": "Hello, Ann!"}]
        # The facts reached the tool: module and node come from MESH_MODULE and MESH_NODE.
        assert greeted["structuredContent"] == {"greeting": "Hello, Ann!", "module": "hello-python", "node": "node-a"}

        said = child.call("echo.say", {"text": "ping pong"})
        assert said["isError"] is False
        assert said["content"] == [{"type": "text", "text": "ping pong"}]

        assert child.request("ping") == {}
        bad = child.call("greet", {})
        assert bad["isError"] is True
    assert data_dir.is_dir(), "facts() creates the data folder"
    # Logs went to stderr (stdout carried only protocol, or the client would have choked on it).
    stderr = child.proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "INFO hello-python: greeted Ann" in stderr


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
def test_protocol_revisions_the_runtime_accepts(tmp_path: Path, version: str) -> None:
    child = RawChild([sys.executable, "main.py"], SOURCE, from_source_env(tmp_path, SOURCE))
    try:
        assert child.initialize(version)["result"]["protocolVersion"] == version
    finally:
        child.close()


def test_unknown_revision_gets_the_newest_handshake_revision(tmp_path: Path) -> None:
    child = RawChild([sys.executable, "main.py"], SOURCE, from_source_env(tmp_path, SOURCE))
    try:
        assert child.initialize("2099-01-01")["result"]["protocolVersion"] == "2025-11-25"
    finally:
        child.close()


def test_twenty_calls_in_flight_answered_by_id(tmp_path: Path) -> None:
    child = RawChild([sys.executable, "main.py"], SOURCE, from_source_env(tmp_path, SOURCE))
    try:
        child.initialize()
        expected: dict[int, str] = {}
        for i in range(1, 21):  # every request written before any reply is read
            if i % 2:
                child.call(i, "greet", {"name": f"n{i}"})
                expected[i] = f"Hello, n{i}!"
            else:
                child.call(i, "echo.say", {"text": f"t{i}"})
                expected[i] = f"t{i}"
        replies = [child.read() for _ in range(20)]
        got = {r["id"]: r["result"]["content"][0]["text"] for r in replies}
        assert got == expected
    finally:
        child.close()


# --- the SDK under load: slow calls, cancellation, stdin closing ----------------------------

SLOW_BUNDLE = textwrap.dedent(
    """
    import time
    import anyio
    from mesh_sdk import Server, ToolError

    server = Server("slow")

    @server.tool()
    async def nap(seconds: float) -> str:
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def block(seconds: float) -> str:
        time.sleep(seconds)
        return f"blocked {seconds}"

    @server.tool()
    def refuse() -> str:
        raise ToolError("no, and here is why")

    server.run()
    """
)


@pytest.fixture
def slow_child(tmp_path: Path):
    (tmp_path / "main.py").write_text(SLOW_BUNDLE)
    child = RawChild([sys.executable, "main.py"], tmp_path, from_source_env(tmp_path, tmp_path))
    child.initialize()
    yield child
    child.close()


def test_slow_calls_do_not_hold_up_others(slow_child: RawChild) -> None:
    start = time.monotonic()
    slow_child.call(1, "nap", {"seconds": 3})  # async: waits on the event loop
    slow_child.call(2, "block", {"seconds": 3})  # sync: blocks a worker thread
    slow_child.call(3, "nap", {"seconds": 0})
    slow_child.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
    first_two = {slow_child.read()["id"], slow_child.read()["id"]}
    assert first_two == {3, 4}
    assert time.monotonic() - start < 2, "the fast call and the ping waited for a slow call"
    assert {slow_child.read()["id"], slow_child.read()["id"]} == {1, 2}


def test_cancelled_call_gets_no_reply_and_the_child_goes_on(slow_child: RawChild) -> None:
    slow_child.call(1, "nap", {"seconds": 30})
    time.sleep(0.3)
    slow_child.send(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "timeout"}}
    )
    slow_child.send({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert slow_child.read() == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_tool_error_message_reaches_the_caller(slow_child: RawChild) -> None:
    slow_child.call(1, "refuse", {})
    reply = slow_child.read()["result"]
    assert reply["isError"] is True
    # The library prefixes "Error executing tool refuse: "; the tool's own words follow.
    assert reply["content"][0]["text"].endswith("no, and here is why")


def test_closing_stdin_exits_at_once_with_a_call_in_flight(slow_child: RawChild) -> None:
    slow_child.call(1, "nap", {"seconds": 30})
    time.sleep(0.3)
    assert slow_child.close() < 3
    assert slow_child.proc.returncode == 0


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def test_the_modern_era_is_answered_over_the_pipes(tmp_path: Path) -> None:
    # No initialize: a 2026-07-28 client stamps its envelope on every request (the library's
    # second era); the SDK's own stdio transport carries it like any other message.
    child = RawChild([sys.executable, "main.py"], SOURCE, from_source_env(tmp_path, SOURCE))
    try:
        child.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "echo.say", "arguments": {"text": "modern"}, "_meta": MODERN_META},
            }
        )
        reply = child.read()
        assert reply["id"] == 1
        assert reply["result"]["content"] == [{"type": "text", "text": "modern"}]
        assert reply["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "hello-python"
    finally:
        child.close()


def _era_checks(child: RawChild) -> None:
    """A modern connection: calls answered, a later `initialize` refused (the library's era rule)."""
    params = {"name": "echo.say", "arguments": {"text": "m"}, "_meta": MODERN_META}
    child.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # a frame before the opening request
    child.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    child.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
    replies = {r["id"]: r for r in (child.read(), child.read())}
    assert [replies[i]["result"]["content"][0]["text"] for i in (1, 2)] == ["m", "m"]
    child.send({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}})
    assert child.read()["error"]["code"] == -32022  # UNSUPPORTED_PROTOCOL_VERSION, naming the served versions


# mesh_sdk/eras.py serves the era's loop of the library directly when the library has it, and
# falls back to the library's public Server.run when a release lacks those private loops.
NO_PRIVATE_LOOPS = (  # as on a release without them: eras.DIRECT is False
    "import mesh_sdk.eras as e; e.DIRECT = False; "
    "import runpy, sys; sys.argv = ['main.py']; runpy.run_path('main.py', run_name='__main__')"
)


@pytest.mark.parametrize("path", ["direct", "public Server.run"])
def test_each_era_is_decided_by_the_opening_request(tmp_path: Path, path: str) -> None:
    argv = [sys.executable, "main.py"] if path == "direct" else [sys.executable, "-c", NO_PRIVATE_LOOPS]
    probe = "import mesh_sdk.eras as e; print(e.DIRECT)"
    direct = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(SDK)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"this mcp release offers the direct era loops: {direct}")
    env = from_source_env(tmp_path, SOURCE)
    child = RawChild(argv, SOURCE, env)
    try:
        _era_checks(child)
    finally:
        child.close()
    child = RawChild(argv, SOURCE, env)
    try:  # a handshake connection: served, and an enveloped request refused
        assert child.initialize()["result"]["serverInfo"]["name"] == "hello-python"
        child.call(1, "echo.say", {"text": "legacy"})
        assert child.read()["result"]["content"] == [{"type": "text", "text": "legacy"}]
        params = {"name": "echo.say", "arguments": {"text": "m"}, "_meta": MODERN_META}
        child.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params})
        assert child.read()["error"]["code"] == -32600  # INVALID_REQUEST: this connection is handshake-era
    finally:
        child.close()


class _Reading(asyncio.ReadTransport):
    def is_reading(self) -> bool:
        return True


def test_the_pipe_reader_replays_the_opening_request_and_what_came_before() -> None:

    note = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    lines: list[bytes | None] = [*[note] * (OPENING_LEAD_LIMIT + 2), b"not json"]
    lines += [b'{"jsonrpc":"2.0","id":1,"method":"ping"}', b"", b'{"jsonrpc":"2.0","id":2,"method":"ping"}', None]

    async def read_all() -> tuple[Any, list[Any]]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        for line in lines:
            queue.put_nowait(line)
        reader = PipeReader(queue, _Reading())
        opening = await reader.opening()
        got = []
        with pytest.raises(anyio.EndOfStream):
            while True:
                got.append(await reader.receive())
        return opening, got

    opening, got = asyncio.run(read_all())
    assert (opening.method, opening.id) == ("ping", 1)
    # The first frames up to the limit, then the request; the bad line past the limit is dropped too.
    kinds = [type(g.message).__name__ if not isinstance(g, Exception) else "error" for g in got]
    assert kinds == ["JSONRPCNotification"] * OPENING_LEAD_LIMIT + ["JSONRPCRequest", "JSONRPCRequest"]
    assert [g.message.id for g in got[-2:]] == [1, 2]


def test_a_bad_line_is_dropped_and_a_print_misses_the_wire(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        textwrap.dedent(
            """
            from mesh_sdk import Server

            server = Server("printer")

            @server.tool()
            def shout(text: str) -> str:
                print("stray output from a tool")  # fd 1 is stderr while serving
                return text.upper()

            server.run()
            """
        )
    )
    child = RawChild([sys.executable, "main.py"], tmp_path, from_source_env(tmp_path, tmp_path))
    try:
        child.initialize()
        assert child.proc.stdin is not None
        child.proc.stdin.write(b"this is not json\n")  # the library drops it (as its own stdio does)
        child.proc.stdin.flush()
        child.call(2, "shout", {"text": "hi"})
        assert child.read()["result"]["content"] == [{"type": "text", "text": "HI"}]
    finally:
        child.close()
    assert "stray output from a tool" in child.proc.stderr.read().decode()  # type: ignore[union-attr]


def test_a_stdout_that_is_a_file_is_served_too(tmp_path: Path) -> None:
    # asyncio watches pipes, sockets and terminals only; a file falls back to the library's stdio.
    answers = tmp_path / "out.jsonl"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **from_source_env(tmp_path, SOURCE)}
    with answers.open("wb") as stdout:
        proc = subprocess.Popen([sys.executable, "main.py"], cwd=SOURCE, env=env, stdin=subprocess.PIPE, stdout=stdout)
        assert proc.stdin is not None
        call = {"name": "echo.say", "arguments": {"text": "into a file"}, "_meta": MODERN_META}
        proc.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}).encode() + b"\n"
        )
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not answers.read_bytes().endswith(b"\n") and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.stdin.close()
        proc.wait(timeout=10)
    [line] = answers.read_text().splitlines()
    assert json.loads(line)["result"]["content"] == [{"type": "text", "text": "into a file"}]


# --- the call: caller, cancellation, progress (the shared contract on params._meta) ------------

CONTRACT_SERVER = SDK / "fixtures" / "contract_server.py"


@pytest.fixture
def contract(tmp_path: Path) -> Iterator[Wire]:
    """The SDK's fixture bundle (sdk/python/fixtures/contract_server.py) over real stdio, initialized."""
    with serving([sys.executable, str(CONTRACT_SERVER)], cwd=tmp_path, env=from_source_env(tmp_path, tmp_path)) as wire:
        yield wire


class TestCallContract(CallContractTests):
    """Caller (caller(ctx)), cancellation (the task is cancelled; cancelled() is true) and progress,
    as tests/support/call_contract.py checks them for every SDK."""


async def test_progress_and_cancel_over_the_bus_through_a_node(node_factory, tmp_path: Path) -> None:
    """docs/bus.md end to end: bus progress from progress(ctx, ...), a bus cancel cancels the tool's task."""
    entry = ["python", str(CONTRACT_SERVER)]  # the node's interpreter, which has the SDK installed
    await check_progress_and_cancel_over_the_bus(node_factory, tmp_path / "mods", entry, tmp_path / "marker")


def test_a_plain_def_tool_sees_the_cancel_by_polling(contract: Wire, tmp_path: Path) -> None:
    check_cancel(contract, tmp_path / "marker", tool="spin")


def test_progress_from_a_plain_def_tool(contract: Wire) -> None:
    check_progress(contract, tool="count_sync")


def test_caller_parse_and_id() -> None:
    c = mesh_sdk.parse_caller({"account": "ALICE", "user": "alice", "name": None, "via": "mcp"})
    assert c == mesh_sdk.Caller(account="ALICE", user="alice", name=None, via="mcp")
    assert c is not None and c.id == "ALICE/alice"
    bob = mesh_sdk.parse_caller({"account": "BOB", "via": "bus"})
    assert bob is not None and bob.id == "BOB"
    assert mesh_sdk.parse_caller(None) is None
    assert mesh_sdk.parse_caller({"account": "BOB", "via": "post"}) is None
    assert mesh_sdk.parse_caller({"account": "\ud800", "via": "bus"}) is None  # not text: no crash
    assert mesh_sdk.parse_caller({"account": "é" * 128, "via": "bus"}) is not None  # 256 bytes
    assert mesh_sdk.parse_caller({"account": "é" * 129, "via": "bus"}) is None  # 258 bytes


# --- SDK primitives --------------------------------------------------------------------------


def test_seat_verb() -> None:
    assert mesh_sdk.seat_verb("echo", "say") == "echo.say"
    assert mesh_sdk.seat_verb("long-term-memory", "put_item") == "long-term-memory.put_item"
    for seat, verb in [("Echo", "say"), ("echo", "sa.y"), ("echo", ""), ("", "say"), ("echo", "say it"), ("echo", "*")]:
        with pytest.raises(mesh_sdk.ToolNameError):
            mesh_sdk.seat_verb(seat, verb)


def test_tool_names_have_at_most_one_dot() -> None:
    server = mesh_sdk.Server("names")
    with pytest.raises(mesh_sdk.ToolNameError, match="more than one dot"):
        server.tool("a.b.c")(lambda: "x")
    with pytest.raises(mesh_sdk.ToolNameError):
        server.tool("has space")(lambda: "x")
    server.tool("fine")(lambda: "x")
    server.seat_tool("echo", "say")(lambda text: text)


def test_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in mesh_env(tmp_path, tmp_path / "bundle").items():
        monkeypatch.setenv(name, value)
    f = mesh_sdk.facts()
    assert (f.node, f.module, f.bundle) == ("node-a", "hello-python", "tools")
    assert f.bundle_dir == tmp_path / "bundle"
    assert f.data_dir.is_dir()
    monkeypatch.delenv("MESH_DATA_DIR")
    monkeypatch.delenv("MESH_NODE")
    with pytest.raises(mesh_sdk.FactsMissing, match="MESH_NODE, MESH_DATA_DIR are not set"):
        mesh_sdk.facts()


# --- the toolchain ---------------------------------------------------------------------------


def build(root: Path, name: str, source: Path | None = None) -> tuple[Path, BuildOutput]:
    loaded = load_module(HELLO)
    bundle = loaded.module.bundle[0]
    stage = root / name
    stage.mkdir()
    ctx = BuildContext(
        module=loaded,
        bundle=bundle,
        source_dir=source or loaded.source_dir(bundle),
        stage_dir=stage,
        cache_dir=root / "cache",
        repo_root=REPO,
        log=lambda _line: None,
    )
    return stage, TOOLCHAIN.build(ctx)


def snapshot(folder: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file's bytes and executable bit, by relative path."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            files[path.relative_to(folder).as_posix()] = (path.read_bytes(), bool(path.stat().st_mode & stat.S_IXUSR))
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, BuildOutput, BuildOutput]:
    root = tmp_path_factory.mktemp("python-build")
    first, out1 = build(root, "first")
    second, out2 = build(root, "second")
    return first, second, out1, out2


def test_toolchain_check() -> None:
    TOOLCHAIN.check()
    assert TOOLCHAIN.language == "python"


@pytest.mark.slow
def test_build_is_reproducible(built: tuple[Path, Path, BuildOutput, BuildOutput]) -> None:
    first, second, out1, out2 = built
    assert out1 == out2
    assert out1.env == {"PYTHONPATH": "{bundle_dir}/" + VENDOR}
    a, b = snapshot(first), snapshot(second)
    assert sorted(a) == sorted(b)
    different = [p for p in a if a[p] != b[p]]
    assert different == []
    assert "main.py" in a
    assert not [p for p in a if p.endswith(".pyc") or "__pycache__" in p]
    assert not [p for p in a if p.endswith("direct_url.json") or p.startswith(f"{VENDOR}/bin/")]
    # No build paths embedded in the text files.
    for path, (data, _) in a.items():
        if path.endswith((".py", ".txt", ".json", "RECORD", "METADATA")):
            assert str(first).encode() not in data, path
            assert str(REPO).encode() not in data, path


@pytest.mark.slow
def test_staged_bundle_runs_on_its_vendored_packages(
    built: tuple[Path, Path, BuildOutput, BuildOutput], tmp_path: Path
) -> None:
    stage, _, out, _ = built
    env = mesh_env(tmp_path, stage, **{k: v.replace("{bundle_dir}", str(stage)) for k, v in out.env.items()})
    vendor = stage / VENDOR

    # Without site-packages (-S) the only place mesh_sdk and mcp can come from is _vendor.
    probe = "import mesh_sdk, mcp; print(mesh_sdk.__file__); print(mcp.__file__)"
    run = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=stage,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=True,
    )
    for line in run.stdout.split():
        assert Path(line).is_relative_to(vendor), line
    # As the runtime runs it (site-packages on), _vendor still comes first.
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=stage,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=True,
    )
    for line in run.stdout.split():
        assert Path(line).is_relative_to(vendor), line

    with StdioClient([sys.executable, *load_module(HELLO).module.bundle[0].entry[1:]], cwd=stage, env=env) as child:
        child.initialize()
        assert {t["name"] for t in child.list_tools()} == {"greet", "echo.say"}
        assert child.call("greet", {"name": "Bo"})["structuredContent"]["greeting"] == "Hello, Bo!"
        assert child.call("echo.say", {"text": "x"})["content"][0]["text"] == "x"


def test_build_refuses_a_missing_entry_script(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "other.py").write_text("print('not main')\n")
    with pytest.raises(BuildFailed, match="entry names 'main.py'"):
        build(tmp_path, "stage", source=source)
