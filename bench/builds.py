"""What building bundles from source costs, with the toolchains' shared caches (issue 16).

`python -m bench.builds` measures, on this machine as it is (the caches under
MESH_TOOLCHAIN_CACHE, or the default, as they are):

- node: `meshctl node run --manifests bundles` on a fresh state folder, from the exec to every
  bundle `ready` (each bundle's time to ready is printed too); run it twice (--nodes 2) to see a
  first state folder against a second one on the same machine;
- renamed: a renamed copy of hello-rust (another module name, the same Cargo.lock) built;
- one-line: a one-line change to that copy's source, rebuilt; then a node serving that copy
  alone is started, the line changed again and the node started again: rebuilt and serving.

--cold gives each series a fresh toolchain cache folder and a fresh Go build cache (GOCACHE)
under the scratch: a fresh clone on a fresh machine after scripts/setup.sh, whose fetches
(cargo's registry, Go's module cache, npm's cache) are kept as setup leaves them. --before REF
runs the same series first on a checkout of REF (a git worktree in the scratch), so each figure
has its before beside it from the same run. One series at a time: two cold builds at once on two
cores would measure each other.

It prints the figures and the load average; it asserts nothing (the figures are for
docs/performance.md). Scratch: bench/.work/builds (state folders, caches, the copy, REF).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from manifests import load_module

from .modules import hello_copy
from .procs import free_port

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "builds"
_BUILT = re.compile(r"bundle (\S+): built from source in ([\d.]+) s")
_READY = re.compile(r"(?m)^(\S+ \S+) INFO mesh\.bundle: (?:bundle|service) (\S+) (?:ready|running):")


@dataclass
class Series:
    """One checkout measured: its own code, its own caches when cold."""

    label: str
    root: Path  # the checkout whose runtime, toolchains and bundles are measured
    env: dict[str, str]
    figures: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.figures.append(line)
        print(f"[{self.label}] {line}", flush=True)

    def meshctl(self) -> list[str]:
        return [sys.executable, "-m", "runtime.meshctl"]


def _status(series: Series, state: Path, name: str) -> dict | None:
    # Through the node's state folder: the embedded bus has accounts, bus.json names the login.
    argv = [*series.meshctl(), "node", "status", "--state-dir", str(state), "--name", name, "--json", "--timeout", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=series.root, env=series.env)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _served(manifests: Path) -> set[str]:
    """module/bundle of every tools and service bundle of the modules under `manifests`."""
    served = set()
    for folder in sorted(manifests.iterdir()):
        if (folder / "module.toml").is_file():
            module = load_module(folder).module
            served |= {f"{module.name}/{b.name}" for b in module.bundle if b.kind in ("tools", "service")}
    return served


def _log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def node_run(
    series: Series, state: Path, manifests: Path, timeout: float
) -> tuple[float, dict[str, float], dict[str, float], list[str]]:
    """A node on `manifests`: seconds to every bundle ready, each bundle's, each build's, failures.

    Also `cpu`, in the builds dict: the CPU seconds the node and everything it waited for used
    (its compilers, its children), from the exec to its exit."""
    port = free_port()
    name = f"builds-{state.name}"
    argv = [*series.meshctl(), "node", "run", "--manifests", str(manifests), "--state-dir", str(state)]
    argv += ["--name", name, "--embedded-port", str(port)]
    expected = _served(manifests)
    log_path = state.parent / f"{state.name}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    ready: dict[str, float] = {}
    failed: list[str] = []
    took = float("nan")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, started_wall, asked = time.monotonic(), time.time(), time.monotonic()
    with open(log_path, "ab") as log:
        node = subprocess.Popen(argv, cwd=series.root, env=series.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            # The node's log says when each bundle is ready; a status call (a Python process of
            # its own, 0.7 s of CPU) only now and then, for failures: polling it twice a second
            # took most of a core from the builds measured.
            while time.monotonic() - started < timeout:
                with open(log_path, "rb") as lines:
                    lines.seek(offset)
                    for m in _READY.finditer(lines.read().decode(errors="replace")):
                        ready.setdefault(m[2], _log_time(m[1]) - started_wall)
                if time.monotonic() - asked > 15:
                    asked = time.monotonic()
                    for b in (_status(series, state, name) or {}).get("bundles", []):
                        key = f"{b['module']}/{b['bundle']}"
                        if b["state"] == "failed" and key not in failed:
                            failed.append(f"{key}: {b['last_error']}")
                if set(ready) | {f.split(":")[0] for f in failed} >= expected:
                    took = max(ready.values(), default=0.0)
                    break
                time.sleep(0.25)
            else:
                failed.append(f"not all ready after {timeout:.0f} s")
        finally:
            node.terminate()
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    built = {m[1]: float(m[2]) for m in _BUILT.finditer(log_path.read_text(errors="replace"))}
    built["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, ready, built, failed


def _nodes(series: Series, work: Path, count: int, timeout: float) -> None:
    for n in range(count):
        state = work / f"state-{n + 1}"
        took, ready, built, failed = node_run(series, state, series.root / "bundles", timeout)
        cpu = built.pop("cpu")
        series.say(f"node on fresh state folder {n + 1}: every bundle ready after {took:.1f} s ({cpu:.0f} s of CPU)")
        shown = sorted(ready.items(), key=lambda kv: -kv[1])
        series.say(
            "  ready: "
            + ", ".join(f"{k} {v:.1f} s" + (f" (build {built[k]:.1f} s)" if k in built else "") for k, v in shown)
        )
        for problem in failed:
            series.say(f"  not ready: {problem}")


def _build(series: Series, module: Path) -> float:
    """Every bundle of `module` staged by the series' own toolchains, in a process of its own."""
    code = (
        "import sys, tempfile, time\nfrom pathlib import Path\nfrom manifests import load_module\n"
        "from toolchains.build import stage_bundle\nloaded = load_module(Path(sys.argv[1]))\n"
        "for bundle in loaded.module.bundle:\n"
        "    with tempfile.TemporaryDirectory() as stage:\n"
        "        stage_bundle(loaded, bundle, Path(stage), progress=lambda _: None)\n"
    )
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code, str(module)], cwd=series.root, env=series.env, check=True)
    return time.monotonic() - started


def _rust(series: Series, work: Path, timeout: float) -> None:
    copies = work / "copies"
    copy = hello_copy(copies, "rust", "hello-rust-renamed")
    # The copy is made from this checkout's hello-rust; point its SDK at the series' own.
    cargo_toml = copies / copy.module / "src" / "Cargo.toml"
    sdk = os.path.relpath(series.root / "sdk" / "rust", cargo_toml.parent)
    cargo_toml.write_text(re.sub(r'path = "[^"]*sdk/rust"', f'path = "{sdk}"', cargo_toml.read_text()))
    shutil.copyfile(series.root / "bundles" / "hello-rust" / "src" / "Cargo.lock", cargo_toml.with_name("Cargo.lock"))
    module = copies / copy.module
    series.say(f"renamed copy of hello-rust built in {_build(series, module):.1f} s")
    main_rs = module / "src" / "src" / "main.rs"
    text = main_rs.read_text()
    main_rs.write_text(text.replace("Hello, ", "Hi there, ", 1))
    series.say(f"one-line change to it rebuilt in {_build(series, module):.1f} s")
    # Rebuilt and serving: a node serving the copy alone, started after another one-line change.
    state = work / "state-rust"
    node_run(series, state, copies, timeout)  # serving the current source
    main_rs.write_text(text.replace("Hello, ", "Hey, ", 1))
    took, _, built, failed = node_run(series, state, copies, timeout)
    built.pop("cpu")
    build = built.get(f"{copy.module}/tools")
    series.say(
        f"one-line change, node started again: rebuilt and serving after {took:.1f} s"
        + (f" (build {build:.1f} s)" if build is not None else "")
        + "".join(f"; not ready: {p}" for p in failed)
    )


def _caches(series: Series) -> str:
    """Which per-user caches a build reads, and whether they hold anything yet."""

    def held(path: Path) -> str:
        return "warm" if path.is_dir() and any(path.iterdir()) else "cold"

    home = Path.home()
    go = subprocess.run(["go", "env", "GOCACHE", "GOMODCACHE"], capture_output=True, text=True, env=series.env)
    gocache, gomod = (go.stdout.split("\n") + ["", ""])[:2] if go.returncode == 0 else ("", "")
    cargo = Path(os.environ.get("CARGO_HOME") or home / ".cargo") / "registry"
    npm = home / ".npm" / "_cacache"
    return (
        f"toolchain cache {series.env.get('MESH_TOOLCHAIN_CACHE', '(default)')}; Go build cache {gocache} "
        f"({held(Path(gocache)) if gocache else '?'}), Go modules ({held(Path(gomod)) if gomod else '?'}), "
        f"cargo registry ({held(cargo)}), npm cache ({held(npm)}); Python bundles run from source (no pip)"
    )


def _checkout(ref: str, folder: Path) -> Path:
    subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), ref], cwd=ROOT, check=True, capture_output=True)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="node runs, each on a fresh state folder")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-rust", action="store_true", help="skip the renamed copy and the one-line change")
    parser.add_argument("--cold", action="store_true", help="a fresh toolchain cache and Go build cache per series")
    parser.add_argument("--before", metavar="REF", help="measure a checkout of REF first, the same way")
    args = parser.parse_args()
    shutil.rmtree(WORK / "now", ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    runs = [Series("now", ROOT, dict(os.environ))]
    if args.before:
        before = _checkout(args.before, WORK / "before-src")
        shutil.rmtree(WORK / "before", ignore_errors=True)
        runs.insert(0, Series(f"before ({args.before})", before, dict(os.environ, PYTHONPATH=str(before))))
    for series in runs:
        work = WORK / ("before" if series.root != ROOT else "now")
        work.mkdir(parents=True, exist_ok=True)
        if args.cold:
            series.env["MESH_TOOLCHAIN_CACHE"] = str(work / "toolchain-cache")
            series.env["GOCACHE"] = str(work / "go-build-cache")
        series.say(_caches(series))
        load = os.getloadavg()
        series.say(f"load average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        _nodes(series, work, args.nodes, args.timeout)
        if not args.no_rust and shutil.which("cargo"):
            _rust(series, work, args.timeout)
        load = os.getloadavg()
        series.say(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    if len(runs) > 1:
        print("\nside by side:")
        for pair in zip(*(s.figures for s in runs)):
            print(f"  before: {pair[0]}\n  now:    {pair[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
