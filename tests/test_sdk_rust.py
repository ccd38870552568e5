"""The Rust SDK, the Rust toolchain and the hello-rust bundle, end to end over real stdio.

Builds hello-rust twice with `toolchains.rust` (the bytes must match), runs the staged binary as
the runtime would (cwd = bundle folder, MESH_* environment) and drives it with the test stdio
client. Needs cargo; without it every test here is skipped with the reason shown. The cargo
target folders live in a persistent cache (.cache/toolchains/rust in the checkout), so only the
first run pays for compiling the dependencies (about a minute on two cores).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.bus_contract import check_progress_and_cancel_over_the_bus
from tests.support.call_contract import CallContractTests, Wire, serving
from tests.support.sdk import build_context, facts_env, file_tree, require
from tests.support.stdio_client import PROTOCOL_VERSION, StdioClient
from toolchains.base import BuildFailed, BuildOutput, ToolchainMissing
from toolchains.rust import JOBS, TOOLCHAIN

REPO = Path(__file__).resolve().parent.parent
MODULE_DIR = REPO / "bundles" / "hello-rust"
CACHE = REPO / ".cache" / "toolchains" / "rust"

pytestmark = [pytest.mark.slow, pytest.mark.toolchain("rust")]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildOutput, Path]:
    """hello-rust built twice into two stages; returns (first stage, its output, second stage)."""
    require(TOOLCHAIN)
    base = tmp_path_factory.mktemp("rust-build")
    started = time.monotonic()
    out1 = TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage1", CACHE))
    first = time.monotonic() - started
    out2 = TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage2", CACHE))
    print(f"hello-rust: first build {first:.1f}s, second {time.monotonic() - started - first:.1f}s")
    assert out1 == out2
    return base / "stage1", out1, base / "stage2"


@pytest.fixture
def child(built: tuple[Path, BuildOutput, Path], tmp_path: Path) -> Iterator[StdioClient]:
    stage = built[0]
    env = facts_env("hello-rust", stage, tmp_path / "data" / "hello-rust")
    client = StdioClient([str(stage / "bin" / "hello-rust")], cwd=stage, env=env)
    yield client
    client.close()


def test_build_is_reproducible_and_staged(built: tuple[Path, BuildOutput, Path]) -> None:
    stage1, out, stage2 = built
    tree1, tree2 = file_tree(stage1), file_tree(stage2)
    assert list(tree1) == ["bin/hello-rust"]
    assert tree1 == tree2, "two builds of the same source differ"
    binary = tree1["bin/hello-rust"][0]
    assert binary[:4] == b"\x7fELF"
    assert tree1["bin/hello-rust"][1] & 0o111, "the binary is not executable"
    cargo_home = os.environ.get("CARGO_HOME") or str(Path.home() / ".cargo")
    for path in (REPO, CACHE, cargo_home):
        assert str(path).encode() not in binary, f"an absolute build path ({path}) is baked into the binary"
    assert b".symtab" not in binary, "the binary is not stripped"
    assert out.os == "linux" and out.arch in ("amd64", "arm64") and out.env == {}


def test_initialize_list_and_call(child: StdioClient, tmp_path: Path) -> None:
    init = child.initialize()
    assert init["protocolVersion"] == PROTOCOL_VERSION
    assert init["serverInfo"] == {"name": "hello-rust", "version": "0.1.0"}
    assert (tmp_path / "data" / "hello-rust").is_dir(), "mesh_sdk::facts() did not create MESH_DATA_DIR"

    tools = {t["name"]: t for t in child.list_tools()}
    assert set(tools) == {"greet"}
    schema = tools["greet"]["inputSchema"]
    assert schema["type"] == "object" and schema["required"] == ["name"]
    assert schema["properties"]["name"]["type"] == "string"

    greeting = child.call("greet", {"name": "Ada"})
    assert greeting["content"] == [{"type": "text", "text": "Hello, Ada! (rust)"}]
    assert greeting["structuredContent"] == {"greeting": "Hello, Ada! (rust)"}
    assert not greeting.get("isError")

    bad = child.call("greet", {})  # missing a required argument: a tool error, not a protocol one
    assert bad["isError"] is True

    assert child.request("ping") == {}
    started = time.monotonic()
    assert child.close() == 0, "closing stdin must end the child cleanly"
    assert time.monotonic() - started < 2, "closing stdin must end the child at once"


def test_many_calls_in_flight(child: StdioClient) -> None:
    child.initialize()
    # all written before any reply is read
    results = child.calls_in_flight({1000 + i: ("greet", {"name": f"n{i}"}) for i in range(20)}, timeout=10)
    for i in range(20):
        text = f"Hello, n{i}! (rust)"
        result = results[1000 + i]
        assert not result.get("isError"), result
        assert result["content"] == [{"type": "text", "text": text}]
        assert result["structuredContent"] == {"greeting": text}


# stdin and stdout are read and written through tokio's reactor when they are pipes (the tests
# above) or sockets, and through tokio's blocking threads otherwise: a regular file cannot be
# watched by epoll. Each kind must serve.
def _requests(*after_init: dict[str, Any]) -> bytes:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"}, *after_init]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


GREET_CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "greet", "arguments": {"name": "f"}},
}


def _answers(data: bytes) -> dict[int, dict[str, Any]]:
    """The complete answer lines in `data`, by id."""
    return {a["id"]: a for a in map(json.loads, data.split(b"\n")[:-1]) if "id" in a}


def _spawn(built: tuple[Path, BuildOutput, Path], tmp_path: Path, **stdio: Any) -> subprocess.Popen[bytes]:
    stage = built[0]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LOG_LEVEL": "warn"}
    env |= facts_env("hello-rust", stage, tmp_path / "data" / "hello-rust")
    return subprocess.Popen([str(stage / "bin" / "hello-rust")], cwd=stage, env=env, **stdio)


def _check_greeted(answers: dict[int, dict[str, Any]]) -> None:
    assert answers[1]["result"]["protocolVersion"] == PROTOCOL_VERSION
    assert answers[2]["result"]["structuredContent"] == {"greeting": "Hello, f! (rust)"}


def test_stdout_to_a_regular_file_is_written(built: tuple[Path, BuildOutput, Path], tmp_path: Path) -> None:
    out = tmp_path / "answers.jsonl"
    with out.open("wb") as stdout:
        child = _spawn(built, tmp_path, stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.DEVNULL)
    assert child.stdin is not None
    child.stdin.write(_requests(GREET_CALL))
    child.stdin.flush()
    deadline = time.monotonic() + 10
    while 2 not in _answers(out.read_bytes()):
        assert time.monotonic() < deadline, f"no answer to the call in the file: {out.read_bytes()!r}"
        time.sleep(0.02)
    child.stdin.close()
    assert child.wait(timeout=5) == 0
    _check_greeted(_answers(out.read_bytes()))


def test_stdin_from_a_regular_file_is_read_to_its_end(built: tuple[Path, BuildOutput, Path], tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(_requests({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
    with requests.open("rb") as stdin:
        child = _spawn(built, tmp_path, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = child.communicate(timeout=10)
    # The file's end is stdin closing: the child exits then, whether or not the ping was answered.
    assert child.returncode == 0, err.decode(errors="replace")
    assert _answers(out)[1]["result"]["protocolVersion"] == PROTOCOL_VERSION


def test_a_socket_for_stdin_and_stdout_is_served(built: tuple[Path, BuildOutput, Path], tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        child = _spawn(built, tmp_path, stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL)
        theirs.close()
        ours.settimeout(10)
        ours.sendall(_requests(GREET_CALL))
        got = b""
        while 2 not in _answers(got):
            chunk = ours.recv(65536)
            assert chunk, f"the child closed the socket early: {got!r}"
            got += chunk
        ours.shutdown(socket.SHUT_WR)  # stdin's end: the child exits at once
        assert child.wait(timeout=5) == 0
    _check_greeted(_answers(got))


def _greet_over_pipes(child: subprocess.Popen[bytes]) -> dict[int, dict[str, Any]]:
    """initialize and one greet written to the child's stdin; the answers read from its stdout."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(_requests(GREET_CALL))
    child.stdin.flush()
    got = b""
    while 2 not in _answers(got):
        line = child.stdout.readline()
        assert line, f"the child closed stdout early: {got!r}"
        got += line
    return _answers(got)


def _pipe_fds_nonblocking(pid: int, pipe_fd: int) -> dict[int, bool]:
    """The child's descriptors on the same pipe as our `pipe_fd`, each with whether its open file
    is non-blocking (from /proc: what the SDK chose, seen from outside)."""
    wanted = f"pipe:[{os.fstat(pipe_fd).st_ino}]"
    found = {}
    for link in Path(f"/proc/{pid}/fd").iterdir():
        if os.readlink(link) == wanted:
            flags = (Path(f"/proc/{pid}/fdinfo") / link.name).read_text().split("flags:")[1].split()[0]
            found[int(link.name)] = bool(int(flags, 8) & os.O_NONBLOCK)
    return found


def test_pipes_are_polled_and_stdout_shared_with_stderr_is_not(
    built: tuple[Path, BuildOutput, Path], tmp_path: Path
) -> None:
    # Separate pipes (as the runtime gives them): both made non-blocking for the reactor.
    # fd 1 itself is pointed at stderr; the protocol is written on a duplicate of the old fd 1.
    child = _spawn(built, tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _check_greeted(_greet_over_pipes(child))
        assert child.stdin is not None and child.stdout is not None
        into = _pipe_fds_nonblocking(child.pid, child.stdin.fileno())
        assert 0 in into and all(into.values()), into  # fd 0 and the reactor's duplicate of it
        out = _pipe_fds_nonblocking(child.pid, child.stdout.fileno())
        assert 1 not in out and list(out.values()) == [True], out
    finally:
        child.kill()
        child.wait()
    # stdout and stderr on one pipe (`2>&1`): a non-blocking stdout would make stderr so too, and
    # a full pipe would then drop log lines; the SDK leaves it blocking and still answers.
    child = _spawn(built, tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _check_greeted(_greet_over_pipes(child))
        assert child.stdin is not None and child.stdout is not None
        shared = _pipe_fds_nonblocking(child.pid, child.stdout.fileno())
        assert {1, 2} <= set(shared) and not any(shared.values()), shared
        child.stdin.close()
        assert child.wait(timeout=5) == 0
    finally:
        child.kill()
        child.wait()


SDK_TARGET = CACHE / "sdk-test-target"


def _cargo(*args: str) -> None:
    env = dict(os.environ, CARGO_TARGET_DIR=str(SDK_TARGET))
    proc = subprocess.run(
        ["cargo", *args, "--locked", "-j", str(JOBS), "--color", "never"],
        cwd=REPO / "sdk" / "rust",
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_sdk_unit_tests() -> None:
    """`cargo test` of sdk/rust: seat-verb names, facts, callers, slow calls served side by side, EOF exit."""
    require(TOOLCHAIN)
    _cargo("test")


@pytest.fixture(scope="module")
def contract_binary() -> Path:
    """The SDK's own fixture bundle, examples/contract.rs, built (debug) next to the unit tests."""
    require(TOOLCHAIN)
    _cargo("build", "--example", "contract")
    return SDK_TARGET / "debug" / "examples" / "contract"


@pytest.fixture
def contract(contract_binary: Path) -> Iterator[Wire]:
    with serving([str(contract_binary)], env={"LOG_LEVEL": "warn"}) as wire:
        yield wire


class TestCallContract(CallContractTests):
    """Caller, cancellation (the CancellationToken), progress and asking (Call::elicit), as
    tests/support/call_contract.py checks them."""


def test_missing_cargo_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CARGO_HOME", str(tmp_path / "no-cargo-home"))
    with pytest.raises(ToolchainMissing) as e:
        TOOLCHAIN.check()
    assert e.value.tool == "cargo" and "rustup" in str(e.value)


def _broken_module(root: Path, main_rs: str, lock: bool = True) -> Path:
    module = root / "broken"
    (module / "src" / "src").mkdir(parents=True)
    (module / "module.toml").write_text(
        'name = "broken"\nversion = "0.1.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        'language = "rust"\nsource = "src"\nentry = ["bin/broken"]\n'
    )
    (module / "src" / "Cargo.toml").write_text('[package]\nname = "broken"\nversion = "0.1.0"\nedition = "2024"\n')
    if lock:  # what `cargo generate-lockfile` writes for a package without dependencies
        (module / "src" / "Cargo.lock").write_text(
            "# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\n"
            'version = 4\n\n[[package]]\nname = "broken"\nversion = "0.1.0"\n'
        )
    (module / "src" / "src" / "main.rs").write_text(main_rs)
    return module


def test_compile_error_is_build_failed(tmp_path: Path) -> None:
    require(TOOLCHAIN)
    module = _broken_module(tmp_path, "fn main() { undefined_thing() }\n")
    with pytest.raises(BuildFailed) as e:
        TOOLCHAIN.build(build_context(module, tmp_path / "stage", tmp_path / "cache"))
    assert "undefined_thing" in e.value.output
    assert not (module / "src" / "target").exists(), "the build wrote into the source tree"


def test_missing_lock_file_is_build_failed(tmp_path: Path) -> None:
    require(TOOLCHAIN)
    module = _broken_module(tmp_path, "fn main() {}\n", lock=False)
    with pytest.raises(BuildFailed) as e:
        TOOLCHAIN.build(build_context(module, tmp_path / "stage", tmp_path / "cache"))
    assert "Cargo.lock" in e.value.output


async def test_progress_and_cancel_over_the_bus_through_a_node(
    contract_binary: Path, node_factory, tmp_path: Path
) -> None:
    """docs/bus.md end to end: bus progress from the SDK's progress, a bus cancel reaches the CancellationToken."""
    await check_progress_and_cancel_over_the_bus(
        node_factory, tmp_path / "mods", [], tmp_path / "marker", program=contract_binary
    )
