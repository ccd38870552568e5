"""launcher/sandbox.py's logic, in-process: what the helper is told, what a child is said to run
with, and what is refused, for machines with and without each kernel feature (a `Support` made
by hand stands for each machine). The kernel's own answers are tests/test_sandbox.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launcher import sandbox
from launcher.sandbox import Confinement, Endpoint, Limits, SandboxUnavailable, Support

FULL = Support("/helper", 7, userns=True, netns=True, seccomp=True, as_root=True)
AS_USER = Support("/helper", 7, userns=True, netns=True, seccomp=True, as_root=False)
NO_LANDLOCK = Support("/helper", 0, userns=True, netns=True, seccomp=True, as_root=True)
OLD_LANDLOCK = Support("/helper", 3, userns=True, netns=True, seccomp=True, as_root=True)
NO_NAMESPACES = Support("/helper", 7, userns=False, netns=False, seccomp=True, as_root=False)
NO_HELPER = Support(None, 0, False, False, False, True, "no C compiler (gcc) to build the sandbox helper")

BOX = Confinement(bundle_dir="/srv/b", data_dir="/state/data/m", tmp_dir="/state/tmp/m.tools", runtime=("/opt/py",))
NET = Confinement(
    bundle_dir="/srv/b",
    data_dir="/state/data/m",
    tmp_dir="/state/tmp/m.tools",
    network=(Endpoint("*", 443), Endpoint("127.0.0.1", 5432), Endpoint("db", 443)),
)


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_a_full_confinement_reads_writes_and_limits_what_it_names() -> None:
    argv = sandbox.helper_argv(BOX, FULL, parent=123)
    assert argv[:3] == ["/helper", "-p", "123"] and pairs(argv, "-L") == ["7"]
    read, write = pairs(argv, "-r"), pairs(argv, "-w")
    assert {"/srv/b", "/opt/py", "/usr", "/etc/ld.so.cache", "/proc"} <= set(read)
    assert write == ["/dev/null", "/state/data/m", "/state/tmp/m.tools"]  # nothing else is writable
    assert not any(p == "/etc" or p.startswith(("/state", "/root", "/home", "/tmp")) for p in read if p != "/srv/b")
    assert "/etc/ssl/certs" in read and "/etc/ssl" not in read  # certificates, never /etc/ssl/private
    assert {"-S", "-N"} <= set(argv) and "-I" not in argv and pairs(argv, "-c") == []
    assert pairs(argv, "-l") == [f"data={Limits().max_memory_mb << 20}", f"nofile={Limits().max_open_files}", "core=0"]
    assert "-U" not in argv  # root needs no user namespace (and RLIMIT_NPROC never applies to uid 0)
    assert sandbox.describe(BOX, FULL) == "landlock v7 + seccomp + netns"


def test_a_declared_network_is_its_ports_only_and_no_namespace() -> None:
    argv = sandbox.helper_argv(NET, FULL, parent=1)
    assert pairs(argv, "-c") == ["443", "5432"] and "-I" in argv and "-N" not in argv
    assert sandbox.describe(NET, FULL) == "landlock v7 + seccomp + tcp 443,5432"


def test_a_child_of_another_user_gets_a_user_namespace_and_its_process_limit() -> None:
    limits = Limits(max_memory_mb=64, max_processes=16, max_open_files=128)
    box = Confinement(bundle_dir="/b", data_dir="/d", tmp_dir="/t", limits=limits)
    argv = sandbox.helper_argv(box, AS_USER, parent=1)
    assert "-U" in argv and "-N" in argv
    assert pairs(argv, "-l") == ["data=67108864", "nofile=128", "nproc=16", "core=0"]


def test_relative_extra_paths_are_inside_the_bundle_and_absolute_ones_as_written() -> None:
    box = Confinement(bundle_dir="/srv/b", data_dir="/d", tmp_dir="/t", read=("models", "/srv/m"), write=("cache",))
    argv = sandbox.helper_argv(box, FULL, parent=1)
    assert {"/srv/b/models", "/srv/m"} <= set(pairs(argv, "-r"))
    assert "/srv/b/cache" in pairs(argv, "-w")


def test_without_landlock_a_required_confinement_is_refused_and_saying_why() -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        sandbox.helper_argv(BOX, NO_LANDLOCK, parent=1)
    assert "the kernel has no Landlock" in refused.value.reason
    assert "cannot be confined: the kernel has no Landlock" in str(refused.value)


def test_without_landlock_an_optional_confinement_runs_with_what_there_is_and_says_what_is_missing() -> None:
    box = Confinement(bundle_dir="/b", data_dir="/d", tmp_dir="/t", required=False)
    argv = sandbox.helper_argv(box, NO_LANDLOCK, parent=1)
    assert "-L" not in argv and pairs(argv, "-r") == [] and {"-S", "-N"} <= set(argv)
    assert (
        sandbox.describe(box, NO_LANDLOCK)
        == "seccomp + netns (missing: the kernel has no Landlock (Linux 5.13 or later, with landlock in lsm=))"
    )


def test_landlock_without_tcp_rules_refuses_a_declared_network_unless_optional() -> None:
    with pytest.raises(SandboxUnavailable, match="has no TCP rules"):
        sandbox.helper_argv(NET, OLD_LANDLOCK, parent=1)
    optional = Confinement(bundle_dir="/b", data_dir="/d", tmp_dir="/t", network=NET.network, required=False)
    argv = sandbox.helper_argv(optional, OLD_LANDLOCK, parent=1)
    assert pairs(argv, "-L") == ["3"] and pairs(argv, "-c") == [] and "-I" in argv
    assert sandbox.describe(optional, OLD_LANDLOCK).startswith("landlock v3 + seccomp + tcp unrestricted (missing: ")
    # No network declared: the namespace covers it, even on an old Landlock (said: no scopes).
    assert sandbox.helper_argv(BOX, OLD_LANDLOCK, parent=1)
    assert sandbox.describe(BOX, OLD_LANDLOCK) == (
        "landlock v3 + seccomp + netns (missing: Landlock v3 has no scopes (v6, Linux 6.12): "
        "signals out of the sandbox are not refused)"
    )


def test_without_namespaces_no_network_is_still_no_inet_socket() -> None:
    argv = sandbox.helper_argv(BOX, NO_NAMESPACES, parent=1)
    assert "-N" not in argv and "-U" not in argv and "-I" not in argv  # seccomp refuses inet sockets
    assert not any(x.startswith("nproc=") for x in pairs(argv, "-l"))  # it would count every process of the uid
    assert sandbox.describe(BOX, NO_NAMESPACES) == "landlock v7 + seccomp + no inet sockets"


def test_no_helper_is_refused_and_said() -> None:
    with pytest.raises(SandboxUnavailable, match="no C compiler"):
        sandbox.helper_argv(BOX, NO_HELPER, parent=1)
    assert sandbox.describe(BOX, NO_HELPER) == "none: no C compiler (gcc) to build the sandbox helper"
    assert sandbox.describe(None, FULL, "the node's config says [sandbox] enabled = false") == (
        "none: the node's config says [sandbox] enabled = false"
    )


def test_the_probe_line_is_read_for_every_outcome() -> None:
    full = sandbox._PROBE_LINE.match("landlock=7 userns=root netns=ok seccomp=ok")
    assert full is not None and full.groups() == ("7", "root", "ok", "ok")
    bare = sandbox._PROBE_LINE.match("landlock=0 landlock_error=EOPNOTSUPP userns=EPERM netns=EPERM seccomp=EINVAL")
    assert bare is not None and bare.groups() == ("0", "EPERM", "EPERM", "EINVAL")


def test_the_nodes_python_brings_its_prefix_and_the_sdk() -> None:
    paths = sandbox.program_paths(sys.executable)
    for prefix in (sys.prefix, sys.base_prefix):
        assert prefix in paths or prefix.startswith("/usr")
    import mesh_sdk

    assert any(str(Path(mesh_sdk.__file__).parent).startswith(p) for p in (*paths, "/usr"))
    assert sandbox.program_paths("/usr/bin/env") == ()  # a system program needs nothing more
