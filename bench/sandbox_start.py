"""Child start time with and without the sandbox, for each language's hello bundle, side by side.

`python -m bench.sandbox_start [ROUNDS] [LANGUAGE...]` first times the fixed cost alone: spawn
to exit of /bin/true, ROUNDS x 10 times, through setpriv (unconfined, as before) and through the
sandbox helper with and without a network. Then it builds bundles/hello-{python,typescript,go,rust,c} from
source (the toolchains' cache makes a second run quick), then, for each language, starts its
child through the launcher (`ChildProcess.spawn`) ROUNDS times in alternation, unconfined (util-
linux setpriv for the parent-death signal, as before) and confined (launcher/sandbox.py: Landlock,
seccomp, a network namespace, rlimits), and times spawn -> `initialize` answered. Printed: the
median and p90 of each, and the median of the paired differences (confined - unconfined, each
pair taken one after the other, so the machine's drift cancels out).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from launcher import sandbox
from launcher.env import child_env, resolve_argv
from launcher.process import ChildProcess, ChildSpec, use_pidfd_child_watcher
from manifests import load_module
from toolchains.build import stage_bundle

REPO = Path(__file__).resolve().parents[1]
LANGUAGES = ("python", "typescript", "go", "rust", "c")
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
INIT_LINE = (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}) + "\n").encode()


def stage(language: str, work: Path) -> tuple[list[str], Path, dict[str, str]]:
    """The hello bundle's argv, folder and build env: built into `work` (Python runs from source)."""
    loaded = load_module(REPO / "bundles" / f"hello-{language}")
    bundle = loaded.module.tools_bundles()[0]
    if language == "python":
        folder, env = loaded.source_dir(bundle), {}
    else:
        folder = work / language
        folder.mkdir()
        env = dict(stage_bundle(loaded, bundle, folder, progress=lambda _: None).env)
    return resolve_argv(bundle.entry, folder), folder, env


def spec_for(language: str, argv: list[str], folder: Path, build_env: dict[str, str], state: Path, confined: bool) -> ChildSpec:
    data = state / "data" / f"hello-{language}"
    env = child_env(
        node="bench",
        module=f"hello-{language}",
        bundle="tools",
        bundle_dir=folder,
        data_dir=data,
        manifest_env={},
        pass_env=[],
        build_env=build_env,
    )
    confinement = (
        sandbox.Confinement(
            bundle_dir=str(folder),
            data_dir=str(data),
            tmp_dir=str(state / "tmp" / f"hello-{language}.tools"),
            runtime=sandbox.program_paths(argv[0]),
        )
        if confined
        else None
    )
    return ChildSpec(argv=argv, cwd=str(folder), env=env, confinement=confinement)


def vm_data_mb(pid: int) -> float:
    """The child's writable private memory (what RLIMIT_DATA, max_memory_mb, bounds), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def start_once(spec: ChildSpec) -> tuple[float, str, float]:
    """Spawn to `initialize` answered, in ms; what the child ran with; its VmData then, in MB."""
    answered = asyncio.get_running_loop().create_future()
    err: list[bytes] = []

    def out(line: bytes) -> None:
        if not answered.done() and b'"id":1' in line.replace(b" ", b""):
            answered.set_result(None)

    started = time.perf_counter()
    child = await ChildProcess.spawn(spec, out, err.append)
    child.write(INIT_LINE)
    try:
        await asyncio.wait_for(asyncio.shield(answered), 20)
    except TimeoutError:
        raise RuntimeError(f"{spec.argv[0]} did not answer initialize; stderr: {b' '.join(err[-5:])!r}") from None
    finally:
        elapsed = (time.perf_counter() - started) * 1000
        data = vm_data_mb(child.pid) if child.running else 0.0
        await child.stop(1.0)
        child.close()
    return elapsed, child.confinement, data


async def exec_once(spec: ChildSpec) -> float:
    """Spawn to exit of a program that does nothing (/bin/true), in ms: the start's fixed cost."""
    started = time.perf_counter()
    child = await ChildProcess.spawn(spec, lambda _: None, lambda _: None)
    await child.wait()
    elapsed = (time.perf_counter() - started) * 1000
    child.close()
    return elapsed


async def fixed_cost(state: Path, rounds: int) -> None:
    """setpriv (unconfined) against the helper without and with a network, /bin/true each time."""
    box = sandbox.Confinement(bundle_dir="/usr/bin", data_dir=str(state / "data" / "t"), tmp_dir=str(state / "tmp" / "t"))
    net = sandbox.Confinement(
        bundle_dir="/usr/bin", data_dir=box.data_dir, tmp_dir=box.tmp_dir, network=(sandbox.Endpoint("*", 443),)
    )
    env = {"PATH": "/usr/bin:/bin"}
    specs = {
        "setpriv (unconfined)": ChildSpec(argv=["/bin/true"], cwd="/", env=env),
        "confined, no network": ChildSpec(argv=["/bin/true"], cwd="/", env=env, confinement=box),
        "confined, tcp 443": ChildSpec(argv=["/bin/true"], cwd="/", env=env, confinement=net),
    }
    times: dict[str, list[float]] = {k: [] for k in specs}
    for spec in specs.values():
        await exec_once(spec)
    for i in range(rounds * 10):
        for name in list(specs)[:: 1 if i % 2 == 0 else -1]:
            times[name].append(await exec_once(specs[name]))
    base = times["setpriv (unconfined)"]
    print(f"{'/bin/true, spawn to exit':<26} {'median ms':>9} {'p90 ms':>7} {'paired diff ms':>15}")
    for name, xs in times.items():
        diff = statistics.median([y - x for x, y in zip(base, xs)])
        print(f"{name:<26} {statistics.median(xs):>9.2f} {_p90(xs):>7.2f} {diff:>+15.2f}")
    print()


async def run(rounds: int, languages: tuple[str, ...]) -> None:
    use_pidfd_child_watcher()
    with tempfile.TemporaryDirectory(prefix="mesh-bench-sandbox-") as tmp:
        work = Path(tmp)
        state = work / "state"
        await fixed_cost(state, rounds)
        print(f"{'bundle':<18} {'unconfined ms':>14} {'confined ms':>12} {'paired diff ms':>15} {'VmData MB':>9}   confinement")
        for language in languages:
            argv, folder, build_env = stage(language, work)
            plain = spec_for(language, argv, folder, build_env, state, False)
            boxed = spec_for(language, argv, folder, build_env, state, True)
            for spec in (plain, boxed):  # warm-up: page cache, the helper's probe
                await start_once(spec)
            a: list[float] = []
            b: list[float] = []
            said, data = "", 0.0
            for i in range(rounds):
                order = (plain, boxed) if i % 2 == 0 else (boxed, plain)
                for spec in order:
                    ms, what, mb = await start_once(spec)
                    (b if spec is boxed else a).append(ms)
                    if spec is boxed:
                        said, data = what, max(data, mb)
            diffs = [y - x for x, y in zip(a, b)]
            print(
                f"hello-{language:<12} {statistics.median(a):>8.2f} p90 {_p90(a):<5.1f}"
                f"{statistics.median(b):>7.2f} p90 {_p90(b):<5.1f} {statistics.median(diffs):>+9.2f}"
                f"      {data:>7.1f}   {said}"
            )


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(len(xs) * 0.9)]


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    languages = tuple(sys.argv[2:]) or LANGUAGES
    asyncio.run(run(rounds, languages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
