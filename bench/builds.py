"""What building bundles from source costs, with the toolchains' shared caches (issue 16).

`python -m bench.builds` measures, on this machine as it is (the caches under
MESH_TOOLCHAIN_CACHE, or the default, as they are):

- node: `meshctl node run --manifests bundles` on a fresh state folder, from the exec to every
  bundle `ready` (each bundle's time to ready is printed too); run it twice (--nodes 2) to see a
  first state folder against a second one on the same machine;
- renamed: a renamed copy of hello-rust (another module name, the same Cargo.lock) built;
- one-line: a one-line change to that copy's source, rebuilt.

It prints the figures and the load average; it asserts nothing (the figures are for
docs/performance.md). Scratch: bench/.work/builds (state folders, the copy).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from manifests import load_module
from toolchains.build import stage_bundle

from .modules import hello_copy
from .procs import free_port

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "builds"
MESHCTL = [sys.executable, "-m", "runtime.meshctl"]


def _status(url: str, name: str) -> dict | None:
    proc = subprocess.run(
        [*MESHCTL, "node", "status", "--nats", url, "--name", name, "--json", "--timeout", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def node_run(state: Path, timeout: float) -> tuple[float, dict[str, float], list[str]]:
    """A node on `manifests`: seconds to every bundle ready, each bundle's, and any failures."""
    port = free_port()
    name = f"builds-{state.name}"
    url = f"nats://127.0.0.1:{port}"
    argv = [*MESHCTL, "node", "run", "--manifests", str(ROOT / "bundles"), "--state-dir", str(state)]
    argv += ["--name", name, "--embedded-port", str(port)]
    started = time.monotonic()
    log = open(state.parent / f"{state.name}.log", "wb")
    node = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    ready: dict[str, float] = {}
    failed: list[str] = []
    try:
        while time.monotonic() - started < timeout:
            status = _status(url, name)
            now = time.monotonic() - started
            if status is not None and status["bundles"]:
                for b in status["bundles"]:
                    key = f"{b['module']}/{b['bundle']}"
                    if b["state"] == "ready":
                        ready.setdefault(key, now)
                    elif b["state"] == "failed" and key not in failed:
                        failed.append(f"{key}: {b['last_error']}")
                if len(ready) + len(failed) == len(status["bundles"]):
                    return now, ready, failed
            time.sleep(0.5)
        return float("nan"), ready, [*failed, f"not all ready after {timeout:.0f} s"]
    finally:
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
        log.close()


def _build(module: Path) -> float:
    loaded = load_module(module)
    started = time.monotonic()
    for bundle in loaded.module.bundle:
        with tempfile.TemporaryDirectory() as stage:
            stage_bundle(loaded, bundle, Path(stage), progress=lambda _: None)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="node runs, each on a fresh state folder")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-rust", action="store_true", help="skip the renamed copy and the one-line change")
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    for n in range(args.nodes):
        took, ready, failed = node_run(WORK / f"state-{n + 1}", args.timeout)
        slowest = sorted(ready.items(), key=lambda kv: -kv[1])[:3]
        print(f"node on fresh state folder {n + 1}: every bundle ready after {took:.1f} s", flush=True)
        print("  slowest: " + ", ".join(f"{k} {v:.1f} s" for k, v in slowest), flush=True)
        for problem in failed:
            print(f"  not ready: {problem}", flush=True)
    if not args.no_rust and shutil.which("cargo"):
        copy = hello_copy(WORK / "copies", "rust", "hello-rust-renamed")
        module = WORK / "copies" / copy.module
        print(f"renamed copy of hello-rust built in {_build(module):.1f} s", flush=True)
        main_rs = module / "src" / "src" / "main.rs"
        text = main_rs.read_text()
        main_rs.write_text(text.replace("Hello, ", "Hi there, ", 1))
        print(f"one-line change to it rebuilt in {_build(module):.1f} s", flush=True)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
