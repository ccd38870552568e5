"""runtime/hosting/confine.py: the confinement every child of the node gets from its manifest and
the node's config (the kernel's answers are tests/test_sandbox.py's and tests/test_sandbox_node.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from launcher import sandbox
from launcher.sandbox import Endpoint, Limits, Support
from manifests import load_module
from runtime.config import NodeConfig, SandboxConfig
from runtime.hosting.children import child_of
from runtime.hosting.confine import confinement_of, linked_out, moved
from runtime.hosting.placement import from_source

PROBE_MODULE = Path(__file__).resolve().parents[3] / "children" / "sandbox-probe"
REPO = Path(__file__).resolve().parents[4]
FULL = Support("/helper", 7, userns=True, netns=True, seccomp=True, as_root=True)


def node_config(state: Path, **sandbox_fields: bool) -> NodeConfig:
    return NodeConfig(name="n1", state_dir=str(state), sandbox=SandboxConfig(**sandbox_fields))


def test_every_child_of_the_node_is_confined_by_default_to_its_own_folders(tmp_path: Path) -> None:
    placement = from_source(load_module(PROBE_MODULE))
    spec = placement.loaded.module.bundle[0]
    child, _ = child_of(placement, spec, node_config(tmp_path / "state"), "run1")
    box = child.confinement
    assert box is not None and box.required
    assert box.bundle_dir == str(PROBE_MODULE / "python")
    assert box.data_dir == str(tmp_path / "state" / "data" / "sandbox-probe")
    assert box.tmp_dir == str(tmp_path / "state" / "tmp" / "sandbox-probe.tools")
    # The manifest's fields, as written: extra paths, TCP destinations, limits.
    assert (box.read, box.write) == (("/srv/models",), ("cache",))
    assert box.network == (Endpoint("127.0.0.1", 5432), Endpoint("*", 443))
    assert box.limits == Limits(max_memory_mb=512, max_processes=64, max_open_files=256)
    # The node's own Python brings its prefix; never the state folder, nor the checkout's other bundles.
    assert sys.prefix in box.runtime
    argv = sandbox.helper_argv(box, FULL, parent=1)
    readable = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-r", "-w")]
    state = str(tmp_path / "state")
    assert not [p for p in readable if p == state or (state.startswith(p + "/") and p != "/")]
    assert str(REPO / "bundles") not in readable and str(REPO) not in readable


def test_a_bundle_without_fields_gets_no_network_and_the_default_limits(tmp_path: Path) -> None:
    loaded = load_module(REPO / "bundles" / "hello-python")
    spec = loaded.module.bundle[0]
    box = confinement_of(spec, "hello-python", loaded.source_dir(spec), [sys.executable], node_config(tmp_path))
    assert box.network == () and box.limits == Limits() and (box.read, box.write) == ((), ())
    assert sandbox.describe(box, FULL) == "landlock v7 + seccomp + netns"
    loose = confinement_of(
        spec, "hello-python", loaded.source_dir(spec), [sys.executable], node_config(tmp_path, required=False)
    )
    assert not loose.required


def test_a_build_from_source_moves_the_confinement_to_its_folder(tmp_path: Path) -> None:
    loaded = load_module(REPO / "bundles" / "hello-go")
    spec = loaded.module.bundle[0]
    box = confinement_of(spec, "hello-go", loaded.source_dir(spec), ["bin/hello-go"], node_config(tmp_path))
    built = tmp_path / "state" / "from-source" / "hello-go" / "tools"
    there = moved(box, built, [str(built / "bin" / "hello-go")])
    assert there.bundle_dir == str(built)
    assert msgspec.structs.replace(there, bundle_dir=box.bundle_dir, runtime=box.runtime) == box


def test_links_that_leave_the_bundle_folder_are_followed_two_levels_deep(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "pkg"
    cache.mkdir(parents=True)
    bundle = tmp_path / "bundle"
    (bundle / "node_modules").mkdir(parents=True)
    (bundle / "node_modules" / "pkg").symlink_to(cache)
    (bundle / "inside").symlink_to(bundle / "node_modules")  # stays inside: nothing to add
    (bundle / "gone").symlink_to(tmp_path / "missing")  # leads nowhere: nothing to add
    assert linked_out(str(bundle)) == [str(cache)]
