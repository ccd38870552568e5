"""What a Python SDK child costs against a raw Python child, side by side in one run.

`python -m bench.sdk_calls` starts, round after round, the raw echo child (`echo_child.py`:
stdlib JSON lines, no library) and the echo tool on the Python SDK (`sdk_echo.py`), the SDK
as it is in this checkout and as it was at BEFORE (a git ref, extracted into
`bench/.work/sdk-before`), each with a plain `def` tool and an `async def` one. For each child:

- start-up: spawn to `initialize` answered (median of --starts spawns);
- CPU per call: the child's CPU time (all threads, /proc schedstat) over --calls calls one after
  the other, and over --calls calls with 32 in flight, divided by the calls.

The lean msgspec client (`lean.py`) drives every child the same way, so what differs is the
child. Ratios to the raw child are taken within a round; the table shows medians over rounds.
Every child also answers `initialize` for each MCP revision it claims (checked once).

With Go installed, two more rows: hello-go (the Go SDK) with the collector as Go sets it by
default (GOGC=100, as before issue 16) and as the SDK's Serve sets it (GOGC=200); its `greet`.
With cargo installed, two more: hello-rust (release) on the Rust SDK of this checkout and on the
Rust SDK at --rust-before (stdin and stdout through tokio's blocking threads); its `greet`. A
language whose toolchain is missing is left out with a line saying so; --languages picks some.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

import msgspec

from .lean import LeanClient
from .procs import cpu_ns

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work"
# The Python SDK before issue 16 (mcp's MCPServer on its high-level stdio path).
BEFORE = "1531ff0"
REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
ARGS = b'{"text":"hello"}'
# (after, before): the rows compared within each round.
PAIRS = (
    ("sdk def", "sdk-before def"),
    ("sdk async", "sdk-before async"),
    ("go", "go GOGC=100"),
    ("rust", "rust before"),
)
# The Rust SDK before its stdio went through the reactor (main when that work began).
RUST_BEFORE = "7cdde18"
LANGUAGES = ("python", "go", "rust")
GREET = b'{"name":"hello"}'
Child = tuple[list[str], dict[str, str], str, bytes]  # argv, env, tool, arguments


def _sdk_before(ref: str) -> Path:
    """sdk/python/mesh_sdk at `ref`, extracted once under bench/.work; its folder for PYTHONPATH."""
    folder = WORK / f"sdk-before-{ref}"
    if not (folder / "mesh_sdk" / "__init__.py").is_file():
        _extract(ref, ["sdk/python/mesh_sdk"], folder / "x")
        (folder / "x" / "sdk" / "python" / "mesh_sdk").rename(folder / "mesh_sdk")
    return folder


def _extract(ref: str, paths: list[str], into: Path) -> None:
    """`paths` of the repository at `ref`, written under `into` at their places."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, *paths], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")


def _hello_go() -> Path | None:
    """bundles/hello-go built once into bench/.work (None without Go)."""
    if shutil.which("go") is None:
        print("go rows left out: no `go` on PATH", flush=True)
        return None
    binary = WORK / "hello-go-bench"
    source = ROOT / "bundles" / "hello-go" / "src"
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=source, env=env, check=True)
    return binary


RUST_SOURCES = ["sdk/rust", "bundles/hello-rust/src"]  # the bundle's path dependency is ../../../sdk/rust


def _hello_rust(ref: str | None) -> Path:
    """bundles/hello-rust (release, --locked) on the Rust SDK at `ref`, or of this checkout when None.

    Built from a scratch copy of the bundle and the SDK under bench/.work, at their relative places;
    one cargo target folder serves both, so the crates they share compile once.
    """
    tree = WORK / (f"rust-before-{ref}" if ref else "rust-now")
    if ref is None:  # copied at every run (mtimes kept, so cargo rebuilds only what changed)
        for part in RUST_SOURCES:
            shutil.copytree(ROOT / part, tree / part, dirs_exist_ok=True, ignore=shutil.ignore_patterns("target"))
    elif not (tree / RUST_SOURCES[1] / "Cargo.toml").is_file():
        _extract(ref, RUST_SOURCES, tree)
    target = WORK / "rust-target"
    manifest = tree / RUST_SOURCES[1] / "Cargo.toml"
    command = ["cargo", "build", "--release", "--locked", "--quiet", "--manifest-path", str(manifest)]
    subprocess.run(command, env=dict(os.environ, CARGO_TARGET_DIR=str(target)), check=True)
    binary = WORK / f"hello-rust-{ref or 'now'}"
    shutil.copyfile(target / "release" / "hello-rust", binary)
    binary.chmod(0o755)
    return binary


def _bundle_env(base: dict[str, str], module: str) -> dict[str, str]:
    """The MESH_* facts a compiled hello bundle reads at start."""
    facts = {"MESH_NODE": "bench", "MESH_MODULE": module, "MESH_BUNDLE": "tools"}
    return base | facts | {"MESH_BUNDLE_DIR": str(WORK), "MESH_DATA_DIR": str(WORK / "data")}


def children(before: str, rust_before: str = RUST_BEFORE, languages: tuple[str, ...] = LANGUAGES) -> dict[str, Child]:
    py = sys.executable
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GOGC")}
    found: dict[str, Child] = {"raw": ([py, str(ROOT / "bench" / "echo_child.py")], base, "echo", ARGS)}
    if "python" in languages:
        found |= _python_children(base, before)
    go = _hello_go() if "go" in languages else None
    if go is not None:
        env = _bundle_env(base, "hello-go")
        found["go GOGC=100"] = ([str(go)], {**env, "GOGC": "100"}, "greet", GREET)
        found["go"] = ([str(go)], env, "greet", GREET)
    if "rust" in languages:
        if shutil.which("cargo") is None:
            print("rust rows left out: no `cargo` on PATH", flush=True)
        else:
            env = _bundle_env(base, "hello-rust")
            found["rust before"] = ([str(_hello_rust(rust_before))], env, "greet", GREET)
            found["rust"] = ([str(_hello_rust(None))], env, "greet", GREET)
    return found


def _python_children(base: dict[str, str], before: str) -> dict[str, Child]:
    """The echo tool on the Python SDK of this checkout and at `before`, plain and async."""
    py = sys.executable
    now = str(ROOT / "sdk" / "python")
    then = str(_sdk_before(before))
    echo = str(ROOT / "bench" / "sdk_echo.py")
    return {
        "sdk-before def": ([py, echo], {**base, "PYTHONPATH": then}, "echo", ARGS),
        "sdk def": ([py, echo], {**base, "PYTHONPATH": now}, "echo", ARGS),
        "sdk-before async": ([py, echo], {**base, "PYTHONPATH": then, "BENCH_SDK_ASYNC": "1"}, "echo", ARGS),
        "sdk async": ([py, echo], {**base, "PYTHONPATH": now, "BENCH_SDK_ASYNC": "1"}, "echo", ARGS),
    }


async def _started(argv: list[str], env: dict[str, str]) -> tuple[LeanClient, float]:
    client = LeanClient()
    t0 = time.perf_counter()
    await client.start(argv, env=env)
    await client.initialize()
    return client, time.perf_counter() - t0


async def startup(argv: list[str], env: dict[str, str], starts: int) -> float:
    times = []
    for _ in range(starts):
        client, took = await _started(argv, env)
        times.append(took)
        await client.close()
    return statistics.median(times)


async def revisions(argv: list[str], env: dict[str, str]) -> list[str]:
    """The revisions this child answers `initialize` with when each is offered."""
    answered = []
    for revision in REVISIONS:
        client = LeanClient()
        await client.start(argv, env=env)
        params = {"protocolVersion": revision, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
        raw = await client.request_bytes(b"initialize", msgspec.json.encode(params))
        answered.append(msgspec.json.decode(raw)["protocolVersion"])
        await client.close()
    return answered


async def cpu_per_call(argv: list[str], env: dict[str, str], calls: int, tool: str, args: bytes) -> tuple[float, float]:
    """Child CPU us per call: calls one after the other, then 32 in flight."""
    client, _ = await _started(argv, env)
    try:
        for _ in range(200):  # warm-up: lazy imports, caches, worker threads
            await client.call(tool, args)
        start = cpu_ns(client.pid)
        for _ in range(calls):
            await client.call(tool, args)
        seq = (cpu_ns(client.pid) - start) / calls / 1000
        sem = asyncio.Semaphore(32)

        async def one() -> None:
            async with sem:
                await client.call(tool, args)

        start = cpu_ns(client.pid)
        await asyncio.gather(*(one() for _ in range(calls)))
        conc = (cpu_ns(client.pid) - start) / calls / 1000
        return seq, conc
    finally:
        await client.close()


async def run(
    rounds: int,
    calls: int,
    starts: int,
    before: str,
    rust_before: str = RUST_BEFORE,
    languages: tuple[str, ...] = LANGUAGES,
) -> int:
    kids = children(before, rust_before, languages)
    for name, (argv, env, _, _) in kids.items():
        print(f"{name:18} revisions answered: {', '.join(await revisions(argv, env))}", flush=True)
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in kids}
    ratios: dict[str, list[tuple[float, float, float]]] = {name: [] for name in kids}
    names = list(kids)
    changes: dict[str, list[tuple[float, ...]]] = {}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # a different child first each round
        got: dict[str, tuple[float, float, float]] = {}
        for name in order:
            argv, env, tool, args = kids[name]
            up = await startup(argv, env, starts)
            seq, conc = await cpu_per_call(argv, env, calls, tool, args)
            got[name] = (up, seq, conc)
            rows[name].append(got[name])
        for name in names:
            ratios[name].append(tuple(a / b for a, b in zip(got[name], got["raw"])))  # type: ignore[arg-type]
        for after, before_name in PAIRS:
            if after in got and before_name in got:
                changes.setdefault(after, []).append(tuple(a / b for a, b in zip(got[after], got[before_name])))
        print(f"round {r + 1}/{rounds} done", flush=True)
    load = os.getloadavg()
    print(f"\nSDK children against a raw Python child: {rounds} round(s), {calls} calls per phase, medians;")
    befores = [f"before = sdk/python at {before}"] * any(n.startswith("sdk") for n in kids)
    befores += [f"rust before = sdk/rust at {rust_before}"] * ("rust" in kids)
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" + "".join(f"; {b}" for b in befores))
    print(
        f"{'child':18} {'start-up s':>10} {'CPU us/call seq':>16} {'CPU us/call @32':>16}   ratios to raw (start, seq, @32)"
    )
    for name in names:
        med = [statistics.median(v[i] for v in rows[name]) for i in range(3)]
        rat = [statistics.median(v[i] for v in ratios[name]) for i in range(3)]
        print(f"{name:18} {med[0]:10.3f} {med[1]:16.1f} {med[2]:16.1f}   {rat[0]:.2f}x {rat[1]:.2f}x {rat[2]:.2f}x")
    print(f"\n{'after / before, same round':30} {'start-up':>9} {'CPU seq':>9} {'CPU @32':>9}")
    for after, before_name in PAIRS:
        if after in changes:
            rat = [statistics.median(v[i] for v in changes[after]) for i in range(3)]
            print(f"{after + ' / ' + before_name:30} {rat[0]:8.2f}x {rat[1]:8.2f}x {rat[2]:8.2f}x")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="calls per phase (sequential, then 32 in flight)")
    parser.add_argument("--starts", type=int, default=5, help="spawns per start-up figure")
    parser.add_argument("--before", default=BEFORE, help="git ref of the Python SDK to compare against")
    parser.add_argument("--rust-before", default=RUST_BEFORE, help="git ref of the Rust SDK to compare against")
    parser.add_argument(
        "--languages",
        default=",".join(LANGUAGES),
        help=f"the SDKs to measure, comma-separated, of {', '.join(LANGUAGES)} (the raw child always runs)",
    )
    args = parser.parse_args()
    languages = tuple(part.strip() for part in args.languages.split(",") if part.strip())
    unknown = sorted(set(languages) - set(LANGUAGES))
    if unknown:
        parser.error(f"--languages: unknown {', '.join(unknown)}; choose from {', '.join(LANGUAGES)}")
    return asyncio.run(run(args.rounds, args.calls, args.starts, args.before, args.rust_before, languages))


if __name__ == "__main__":
    sys.exit(main())
