"""Confinement: what a child may touch, enforced by the kernel between fork and exec.

A `Confinement` says what one child may reach: its bundle folder and the system's runtime paths
to read and execute, its data folder and a private temporary folder to write, the extra paths
and TCP ports its manifest declares, and its resource limits. The launcher hands it to
`mesh-sandbox` (launcher/sandbox_exec.c, compiled once with the C compiler into a cache), which
the node spawns in place of the child: it applies Landlock, namespaces, no_new_privs, a seccomp
filter and rlimits, then execs the child in place (same pid). No Python runs between fork and
exec, so a confined start costs what an unconfined one did (util-linux setpriv was exec'd the
same way for the parent-death signal, which the helper sets now).

What the kernel allows is asked once per user (`support()`), and `describe()` says in one line
what a child got, e.g. "landlock v7 + seccomp + netns", or "none: <reason>": never silent.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import grp
import importlib.util
import os
import pwd
import re
import subprocess
import sys

import msgspec

from .sandbox_helper import helper

# Static: the helper's exec then costs no dynamic loader (about 0.1 ms a start).
PROBE_TIMEOUT_S = 10

# The ABI whose features a full confinement uses: TCP rules (4), device ioctls (5), scopes (6).
LANDLOCK_TCP_ABI = 4
LANDLOCK_SCOPE_ABI = 6

# Read and execute: what a libc, a dynamic loader and the interpreters on this node need.
# Files are named one by one in /etc (never /etc whole: /etc/shadow is readable by a root child
# that owns it, and the node's config may live there), and /etc/ssl only for its certificates.
SYSTEM_READ: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/locale.alias",
    "/etc/locale.conf",
    "/etc/default/locale",
    "/etc/mime.types",
    "/etc/os-release",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ssl/cert.pem",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust",
    "/etc/crypto-policies",
    # A process's own /proc entries, the kernel's facts (cpus, memory) runtimes size themselves
    # by, and /sys for the cpu count and cgroup limits Go and Node read at start. Another
    # process's secrets under /proc (environ, mem, fd, maps) stay shut: Landlock refuses ptrace
    # access out of the sandbox, and those files ask for it.
    "/proc",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
    "/sys/kernel/mm/transparent_hugepage",  # Go's runtime sizes its heap pages by it
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
) + tuple(sorted(glob.glob("/etc/python3*")))  # Debian's sitecustomize for its system interpreter
SYSTEM_WRITE: tuple[str, ...] = ("/dev/null",)

# Memory: RLIMIT_DATA (writable private memory), not RLIMIT_AS: Go and Node reserve far more
# address space than they use (V8's cage alone is GBs), so an address-space bound kills them at
# start while a data bound counts what they write into.
DEFAULT_MAX_MEMORY_MB = 4096
DEFAULT_MAX_PROCESSES = 512  # tasks: every thread counts
DEFAULT_MAX_OPEN_FILES = 4096


class SandboxUnavailable(OSError):
    """A confined child was asked for and this machine cannot confine it: it is not started."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cannot be confined: {reason}")


class Endpoint(msgspec.Struct, frozen=True):
    """A TCP destination a child may connect to. Landlock allows by port: `host` is checked as
    written and shown, the kernel enforces the port only (see docs/internals.md)."""

    host: str  # "*", an IP address, or a host name
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class Limits(msgspec.Struct, frozen=True):
    max_memory_mb: int = DEFAULT_MAX_MEMORY_MB
    max_processes: int = DEFAULT_MAX_PROCESSES
    max_open_files: int = DEFAULT_MAX_OPEN_FILES


class Confinement(msgspec.Struct, frozen=True, kw_only=True):
    """What one child may reach; the launcher's API for the node (tools, service, step alike)."""

    bundle_dir: str  # read and execute
    data_dir: str  # read and write (made when missing)
    tmp_dir: str  # read and write, the child's TMPDIR (made when missing, mode 0700)
    # Extra paths from the manifest: read and execute, read and write. Absolute, or relative
    # to the bundle folder (inside it). A path missing at the start is not reachable.
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    # Read paths the program itself needs beyond the system's (an interpreter outside /usr);
    # `program_paths` finds them.
    runtime: tuple[str, ...] = ()
    network: tuple[Endpoint, ...] = ()  # TCP connect allowed to these; none: no network at all
    limits: Limits = Limits()
    # False: where the kernel lacks something (Landlock; TCP rules for a declared network), the
    # child runs with what there is, and `describe` says what is missing. True: it does not start.
    required: bool = True


@dataclasses.dataclass(frozen=True)
class Support:
    """What this machine lets a child of this user be confined with."""

    helper: str | None
    landlock_abi: int  # 0: none
    userns: bool  # a user namespace of its own (needed by a non-root child for netns and nproc)
    netns: bool
    seccomp: bool
    as_root: bool
    reason: str = ""  # why the helper or a feature is missing, for the one line that says so

    def missing(self, confinement: Confinement) -> list[str]:
        """What a full confinement of `confinement` needs and this machine lacks, in words."""
        if self.helper is None:
            return [self.reason]
        out = []
        if self.landlock_abi == 0:
            out.append("the kernel has no Landlock (Linux 5.13 or later, with landlock in lsm=)")
        elif confinement.network and self.landlock_abi < LANDLOCK_TCP_ABI:
            out.append(f"Landlock v{self.landlock_abi} has no TCP rules (v4, Linux 6.7)")
        if not self.seccomp:
            out.append("seccomp filters are refused")
        return out

    def weaker(self) -> list[str]:
        """What this machine's confinement lacks that is said but refuses nothing: a kernel with
        Landlock's files and TCP rules but not its scopes (Linux 6.7 to 6.11) still confines."""
        if self.helper is None or self.landlock_abi == 0 or self.landlock_abi >= LANDLOCK_SCOPE_ABI:
            return []
        return [
            f"Landlock v{self.landlock_abi} has no scopes (v6, Linux 6.12): signals out of the sandbox are not refused"
        ]


_PROBE_LINE = re.compile(r"^landlock=(\d+)(?: landlock_error=\S+)? userns=(\S+) netns=(\S+) seccomp=(\S+)$")
_supported: dict[tuple[int | str | None, int | str | None], Support] = {}


def support(user: int | str | None = None, group: int | str | None = None) -> Support:
    """What a child run as `user` can be confined with here (asked once per user and group)."""
    key = (user, group)
    found = _supported.get(key)
    if found is None:
        found = _supported[key] = _probe(user, group)
    return found


def _probe(user: int | str | None, group: int | str | None) -> Support:
    path, why = helper()
    as_root = _uid(user) == 0
    if path is None:
        return Support(None, 0, False, False, False, as_root, why)
    try:
        done = subprocess.run(
            [path, "--probe"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, user=user, group=group, env={}
        )
    except (OSError, subprocess.SubprocessError) as e:
        return Support(None, 0, False, False, False, as_root, f"the sandbox helper {path} does not run: {e}")
    match = _PROBE_LINE.match(done.stdout.strip())
    if done.returncode != 0 or match is None:
        said = (done.stdout + done.stderr).strip()[-300:]
        return Support(None, 0, False, False, False, as_root, f"the sandbox helper's probe failed: {said!r}")
    abi, userns, netns, seccomp = match.groups()
    reasons = []
    if netns != "ok":
        reasons.append(f"no network namespace ({netns})")
    if userns not in ("ok", "root"):
        reasons.append(f"no user namespace ({userns})")
    return Support(
        path,
        int(abi),
        userns in ("ok", "root"),
        netns == "ok",
        seccomp == "ok",
        userns == "root",
        "; ".join(reasons),
    )


@functools.cache
def program_paths(program: str) -> tuple[str, ...]:
    """Read paths a program needs beyond the system's: an interpreter installed outside /usr
    (pyenv, nvm, a venv) with its prefix, and for the node's own Python its environment and
    the mesh SDK wherever it is installed (an editable install lives in the checkout)."""
    out: list[str] = []
    real = os.path.realpath(program)
    if not _under_system(real):
        parent = os.path.dirname(real)
        out.append(os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent)
    if program == sys.executable or real == os.path.realpath(sys.executable):
        out += [sys.prefix, sys.base_prefix]
        spec = importlib.util.find_spec("mesh_sdk")
        if spec is not None and spec.submodule_search_locations:
            out += list(spec.submodule_search_locations)
    return tuple(dict.fromkeys(p for p in out if not _under_system(p)))


def _under_system(path: str) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in ("/usr", "/bin", "/sbin", "/lib", "/lib64"))


def describe(confinement: Confinement | None, support: Support | None, reason: str = "") -> str:
    """One line for status: what the child runs with, e.g. "landlock v7 + seccomp + netns"."""
    if confinement is None or support is None:
        return f"none: {reason or 'not asked for'}"
    if support.helper is None:
        return f"none: {support.reason}"
    parts = []
    if support.landlock_abi:
        parts.append(f"landlock v{support.landlock_abi}")
    if support.seccomp:
        parts.append("seccomp")
    if not confinement.network:
        parts.append("netns" if support.netns else "no inet sockets")
    elif support.landlock_abi >= LANDLOCK_TCP_ABI:
        parts.append("tcp " + ",".join(sorted({str(e.port) for e in confinement.network}, key=int)))
    else:
        parts.append("tcp unrestricted")
    missing = support.missing(confinement) + support.weaker()
    line = " + ".join(parts)
    return f"{line} (missing: {'; '.join(missing)})" if missing else line


def helper_argv(confinement: Confinement, support: Support, parent: int) -> list[str]:
    """The helper and its arguments, to be followed by "--" and the child's argv.

    Raises SandboxUnavailable when the confinement is required and the machine lacks a part of it.
    """
    if support.helper is None:
        raise SandboxUnavailable(support.reason)
    missing = support.missing(confinement)
    if missing and confinement.required:
        raise SandboxUnavailable("; ".join(missing))
    argv = [support.helper, "-p", str(parent)]
    if support.landlock_abi:
        argv += ["-L", str(support.landlock_abi)]
        bundle = confinement.bundle_dir
        for path in (*SYSTEM_READ, *confinement.runtime, bundle, *(_in(bundle, p) for p in confinement.read)):
            argv += ["-r", path]
        for path in (
            *SYSTEM_WRITE,
            confinement.data_dir,
            confinement.tmp_dir,
            *(_in(bundle, p) for p in confinement.write),
        ):
            argv += ["-w", path]
        if support.landlock_abi >= LANDLOCK_TCP_ABI:
            for port in sorted({e.port for e in confinement.network}):
                argv += ["-c", str(port)]
    if support.seccomp:
        argv.append("-S")
    if confinement.network:
        argv.append("-I")
    elif support.netns:
        argv.append("-N")
    if support.userns and not support.as_root:
        argv.append("-U")
    limits = confinement.limits
    argv += ["-l", f"data={limits.max_memory_mb * 1024 * 1024}", "-l", f"nofile={limits.max_open_files}"]
    if support.userns and not support.as_root:
        # Counted per child only inside its own user namespace; outside one RLIMIT_NPROC counts
        # every process of the uid (the node's and every bundle's), and uid 0 is never limited.
        argv += ["-l", f"nproc={limits.max_processes}"]
    argv += ["-l", "core=0"]  # a core file would hold whatever secrets the child had in memory
    return argv


def _in(bundle_dir: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(bundle_dir, path)


def prepare_folders(confinement: Confinement, user: int | str | None, group: int | str | None) -> None:
    """The data and temporary folders, made when missing (the child could not: their parents
    are outside its sandbox) and owned by the child's user."""
    for folder, mode in ((confinement.data_dir, 0o755), (confinement.tmp_dir, 0o700)):
        if os.path.isdir(folder):
            continue
        os.makedirs(folder, mode=mode, exist_ok=True)
        if user is not None:
            gid = -1 if group is None else (group if isinstance(group, int) else grp.getgrnam(group).gr_gid)
            os.chown(folder, _uid(user), gid)


def _uid(user: int | str | None) -> int:
    if user is None:
        return os.geteuid()
    return pwd.getpwnam(user).pw_uid if isinstance(user, str) else user


def is_ready(user: int | str | None = None, group: int | str | None = None) -> bool:
    """Whether `support(user, group)` is known already (a spawn then asks nothing of the machine)."""
    return (user, group) in _supported


def main(argv: list[str]) -> int:
    """`python -m launcher.sandbox [build|probe]`: build the helper now (setup does), or say
    what this machine allows."""
    path, why = helper()
    if path is None:
        print(f"sandbox helper: {why}", file=sys.stderr)
        return 1
    print(f"sandbox helper: {path}")
    if argv[1:2] == ["probe"]:
        s = support()
        print(f"landlock v{s.landlock_abi}, userns {s.userns}, netns {s.netns}, seccomp {s.seccomp}")
        print("a child with no network gets:", describe(Confinement(bundle_dir="/", data_dir="/", tmp_dir="/"), s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
