"""systemd units: the node runtime's own unit, and one unit per `service` bundle.

Record 0188 point 3: a bundle of kind `service` is a process the host runs as a unit, in
whatever language it is written. One generator for `meshctl node units` (units written ahead)
and for the node itself where it runs under systemd (runtime/hosting/services.py writes, starts and
removes the unit of each service bundle it places); here systemd supervises, not the node. What the unit
gives the process mirrors what the launcher gives a tools child: the bundle folder as working
directory, the entry resolved the same way (`python`/`python3` -> the node's own interpreter,
`node` -> the machine's Node.js, anything else a file inside the bundle) and the MESH_*
variables plus the manifest's `env`.

Unit files are a small language of their own: words are split at whitespace unless quoted,
C escapes apply inside quotes, `%` starts a specifier everywhere, and in Exec lines `$` starts
a variable. The quoting helpers below are the one place that knows this.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from manifests.model import ENV_NAME_RE
from runtime.hosting.from_source import build_from_source
from runtime.hosting.placement import RUN_FROM_SOURCE, Placement
from toolchains.cache_bound import CacheBound

NODE_UNIT = "mesh-node.service"
# Where a node run by systemd keeps its state: /var/lib/<StateDirectory>, created by systemd.

# Characters that make a word need quotes: whitespace, quotes, backslash, and `;`, which would end
# the command in an Exec line.
_NEEDS_QUOTES = set(" \t\n\r\v\f\"'\\;")
_UNSAFE_PROGRAM = set("\"'\\")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\v": "\\v", "\f": "\\f"}
_PLAIN_PATH_RE = re.compile(r"^[A-Za-z0-9._/-]+\Z")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z|^[0-9]+\Z")


class UnitError(Exception):
    """A unit that cannot be written as asked; the message says what would be right."""


# --- quoting ------------------------------------------------------------------------------
def _c_escaped(value: str) -> str:
    out = []
    for ch in value:
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def quote_word(value: str, *, exec_arg: bool = False) -> str:
    """One word of a unit setting, read back by systemd as exactly `value`.

    `%` is doubled everywhere (specifiers are expanded before words are split). In an Exec
    line's arguments (`exec_arg`) `$` is doubled too, because systemd substitutes variables
    there; not in Environment=, where `$` has no meaning and `$$` would stay two dollars.
    """
    if "\0" in value:
        raise UnitError(f"{value!r}: a unit file cannot carry a NUL character")
    text = value.replace("%", "%%")
    if exec_arg:
        text = text.replace("$", "$$")
    if value == ";" and exec_arg:
        return "\\;"  # a lone `;` (even quoted) separates commands; `\;` is the literal word
    if value and not (_NEEDS_QUOTES & set(value)) and value.isprintable():
        return text
    return '"' + _c_escaped(text) + '"'


def exec_line(argv: Sequence[str]) -> str:
    """The value of an ExecStart= line: an absolute program, then its arguments."""
    if not argv or not os.path.isabs(argv[0]):
        raise UnitError(f"ExecStart needs an absolute program path, not {argv[0] if argv else 'nothing'!r}")
    if _UNSAFE_PROGRAM & set(argv[0]) or not argv[0].isprintable():
        # systemd refuses such a program path outright ("contains special characters").
        raise UnitError(
            f"systemd cannot run a program whose path holds quotes, backslashes or control characters: "
            f"{argv[0]!r}; put the bundle in a folder with a plainer name"
        )
    # The program path is taken literally (no variable substitution), so `$` stays single there.
    return " ".join([quote_word(argv[0]), *(quote_word(a, exec_arg=True) for a in argv[1:])])


def environment_line(env: Mapping[str, str]) -> str:
    """The value of an Environment= line holding these assignments, each quoted as needed."""
    words = []
    for key, value in env.items():
        if not ENV_NAME_RE.match(key):
            raise UnitError(f"{key!r} is not a usable environment variable name")
        words.append(quote_word(f"{key}={value}"))
    return " ".join(words)


def path_value(path: str) -> str:
    """A path for a setting that takes one path as is (WorkingDirectory=): no quotes are
    removed there, only `%` is special, and surrounding whitespace would be stripped."""
    if not os.path.isabs(path) or path != path.strip() or not path.isprintable():
        raise UnitError(
            f"{path!r} cannot be a unit's path: write an absolute path without control characters or surrounding blanks"
        )
    return path.replace("%", "%%")


def _user(user: str | None) -> str | None:
    if user is not None and not _USER_RE.match(user):
        raise UnitError(f"{user!r} is not a user name systemd accepts for User=")
    return user


def unit_name(module: str, bundle: str) -> str:
    # Module and bundle names are [a-z][a-z0-9-]{0,62} (manifests check it): safe in a unit name.
    return f"mesh-{module}-{bundle}.service"


def _state_directory(state_dir: Path) -> str | None:
    """StateDirectory= for a state folder under /var/lib: systemd creates it, owned by User=.
    Only plain names: StateDirectory= gives `:` a meaning of its own (a symlink to make)."""
    try:
        rel = state_dir.relative_to("/var/lib")
    except ValueError:
        return None
    text = str(rel)
    return text if rel.parts and _PLAIN_PATH_RE.match(text) else None


def _render(sections: list[tuple[str, list[tuple[str, str | None]]]], header: str) -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for title, settings in sections:
        lines += ["", f"[{title}]"]
        lines += [f"{key}={value}" for key, value in settings if value is not None]
    return "\n".join(lines) + "\n"


# Hardening that leaves children working: they may not gain privileges (setuid binaries), get a
# /tmp of their own, and cannot write /usr, /boot or /etc. /home stays as it is: a state folder
# or a bundle may live there.
_HARDENING: list[tuple[str, str | None]] = [
    ("NoNewPrivileges", "true"),
    ("PrivateTmp", "true"),
    ("ProtectSystem", "full"),
]


# --- the node's own unit ------------------------------------------------------------------
_PRIVATE_TMPS = (Path("/tmp"), Path("/var/tmp"))


def _outside_private_tmp(option: str, path: Path) -> None:
    """Refuse a folder the unit could not see: with PrivateTmp=true the node gets a /tmp and a
    /var/tmp of its own, empty at every start (and systemd-tmpfiles empties the real ones)."""
    for tmp in _PRIVATE_TMPS:
        if path == tmp or tmp in path.parents:
            raise UnitError(
                f"{option} {path} is under {tmp}: the unit runs with PrivateTmp=true, so the node "
                f"would see an empty {tmp} of its own at every start; choose a folder outside {tmp} "
                "(for the state, /var/lib/mesh-node is usual)"
            )


def node_unit(
    *,
    meshctl: str,
    config: str | None,
    name: str | None,
    state_dir: str,
    user: str | None,
    manifests: str | None = None,
) -> str:
    """The text of mesh-node.service: `meshctl node run` supervised by systemd."""
    if not os.path.isabs(meshctl):
        raise UnitError(f"meshctl must be an absolute path for ExecStart, not {meshctl!r}")
    state = Path(os.path.abspath(state_dir))
    _outside_private_tmp("--state-dir", state)
    for option, path in (("--config", config), ("--manifests", manifests)):
        if path:
            _outside_private_tmp(option, Path(os.path.abspath(path)))
    argv = [meshctl, "node", "run"]
    if config:
        argv += ["--config", os.path.abspath(config)]
    if manifests:
        argv += ["--manifests", os.path.abspath(manifests)]
    if name:
        argv += ["--name", name]
    argv += ["--state-dir", str(state)]
    service: list[tuple[str, str | None]] = [
        ("Type", "simple"),
        ("ExecStart", exec_line(argv)),
        ("Restart", "on-failure"),
        ("RestartSec", "1"),
        # SIGTERM goes to the node alone: it stops taking calls, answers those in flight (up to
        # 30 s) and then stops its children itself. Whatever is left in the unit's cgroup after
        # that (a grandchild that left its process group) gets SIGKILL. `control-group` would
        # SIGTERM the children at the same moment and fail the calls the node is draining.
        ("KillMode", "mixed"),
        ("KillSignal", "SIGTERM"),
        ("TimeoutStopSec", "45"),
        ("User", _user(user)),
        ("StateDirectory", _state_directory(state)),
        ("LimitNOFILE", "65536"),
        ("SyslogIdentifier", "mesh-node"),
        *_HARDENING,
    ]
    header = (
        f"{NODE_UNIT}: the mesh node tool runtime{f' (node {name})' if name else ''}.\n"
        "Written by `meshctl node unit`; write it again rather than edit it."
    )
    return _render(
        [
            (
                "Unit",
                [
                    ("Description", "mesh node tool runtime"),
                    ("Wants", "network-online.target"),
                    ("After", "network-online.target"),
                ],
            ),
            ("Service", service),
            ("Install", [("WantedBy", "multi-user.target")]),
        ],
        header,
    )


def default_meshctl() -> str:
    """The meshctl beside the running Python (a venv's bin), else the one on PATH."""
    beside = Path(sys.executable).parent / "meshctl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which("meshctl")
    if found is None:
        raise UnitError("meshctl is not installed where the unit could run it; name it with --meshctl PATH")
    return os.path.abspath(found)


# --- service bundles ----------------------------------------------------------------------
def resolve_entry(module: str, bundle: str, entry: Sequence[str], bundle_dir: Path) -> list[str]:
    """The entry as systemd must run it: an absolute program, then the manifest's arguments."""
    first, rest = entry[0], list(entry[1:])
    if first in ("python", "python3"):
        # Not resolved through symlinks: a venv's python is what finds the venv's packages.
        return [os.path.abspath(sys.executable), *rest]
    if first == "node":
        found = shutil.which("node")
        if found is None:
            raise UnitError(
                f"bundle {module}/{bundle}: its entry runs `node`, which is not installed: apt-get install nodejs"
            )
        return [os.path.abspath(found), *rest]
    program = (bundle_dir / first).absolute()
    if bundle_dir.absolute() not in program.parents:
        raise UnitError(f"bundle {module}/{bundle}: entry {first!r} is outside the bundle folder {bundle_dir}")
    if not program.is_file() or not os.access(program, os.X_OK):
        raise UnitError(
            f"bundle {module}/{bundle}: entry {first!r} is not an executable file in {bundle_dir}; "
            "build the bundle first (`meshctl node units` builds compiled bundles served from source)"
        )
    return [str(program), *rest]


def service_unit(
    placement: Placement,
    bundle_name: str,
    *,
    node: str,
    state_dir: Path,
    user: str | None = None,
) -> str:
    """The text of one service bundle's unit."""
    loaded = placement.loaded
    module = loaded.module
    spec = next(b for b in module.bundle if b.name == bundle_name)
    bundle_dir = Path(placement.dirs[spec.name]).absolute()
    state = Path(os.path.abspath(state_dir))
    data_dir = state / "data" / module.name
    argv = resolve_entry(module.name, spec.name, spec.entry, bundle_dir)
    env: dict[str, str] = {}
    # The same order as the launcher: what the build asks for, then the manifest, then MESH_*.
    for key, value in placement.build_env.get(spec.name, {}).items():
        env[key] = value.replace("{bundle_dir}", str(bundle_dir))
    env.update(spec.env)
    env.update(
        {
            "MESH_NODE": node,
            "MESH_MODULE": module.name,
            "MESH_BUNDLE": spec.name,
            "MESH_BUNDLE_DIR": str(bundle_dir),
            "MESH_DATA_DIR": str(data_dir),
            "PYTHONUNBUFFERED": "1",  # a Python service's log lines reach the journal as written
        }
    )
    state_directory = _state_directory(data_dir)
    service: list[tuple[str, str | None]] = [
        ("Type", "simple"),
        ("WorkingDirectory", path_value(str(bundle_dir))),
        ("ExecStart", exec_line(argv)),
        # One variable a line: easier to read, and `systemctl show` keeps them apart anyway.
        *(("Environment", environment_line({k: v})) for k, v in env.items()),
        # pass_env names variables of the node's environment; for a unit that is the manager's.
        ("PassEnvironment", " ".join(spec.pass_env) or None),
        ("Restart", "on-failure"),
        ("RestartSec", "1"),
        ("User", _user(user)),
        # Under /var/lib systemd creates the data folder (owned by User=); elsewhere it is made
        # when the unit is written (see service_units).
        ("StateDirectory", state_directory),
        ("SyslogIdentifier", unit_name(module.name, spec.name).removesuffix(".service")),
        *_HARDENING,
    ]
    header = (
        f"{unit_name(module.name, spec.name)}: service bundle {spec.name} of module {module.name} "
        f"{module.version} ({spec.language}), run by the host (record 0188 point 3).\n"
        f"From {loaded.path}. Written by `meshctl node units` or the node placing the module; "
        "write it again rather than edit it."
    )
    return _render(
        [
            (
                "Unit",
                [
                    ("Description", f"mesh service {module.name}/{spec.name}"),
                    ("Wants", "network-online.target"),
                    ("After", "network-online.target"),
                ],
            ),
            ("Service", service),
            ("Install", [("WantedBy", "multi-user.target")]),
        ],
        header,
    )


def service_units(
    placements: Iterable[Placement],
    *,
    node: str,
    state_dir: Path | str,
    out_dir: Path | str,
    user: str | None = None,
) -> list[Path]:
    """Write a unit per `service` bundle of every placement into out_dir; return their paths.

    A placement maps each bundle to its folder: the source folder for a module served from
    source, the unpacked artifact for a delivered one. Every unit is rendered before any is
    written, so a bundle that cannot be run leaves out_dir as it was.
    """
    state = Path(os.path.abspath(state_dir))
    rendered: list[tuple[str, str, Path]] = []
    owners: dict[str, str] = {}
    for placement in placements:
        module = placement.loaded.module
        for spec in module.bundle:
            if spec.kind != "service":
                continue
            if spec.name not in placement.dirs:
                raise UnitError(f"bundle {module.name}/{spec.name}: no folder given for it")
            name = unit_name(module.name, spec.name)
            if name in owners:  # "a-b"/"c" and "a"/"b-c" meet in one name
                raise UnitError(
                    f"bundles {owners[name]} and {module.name}/{spec.name} would both be {name}; rename one"
                )
            owners[name] = f"{module.name}/{spec.name}"
            text = service_unit(placement, spec.name, node=node, state_dir=state, user=user)
            rendered.append((name, text, state / "data" / module.name))
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for _, _, data_dir in rendered:
            if _state_directory(data_dir) is None:
                data_dir.mkdir(parents=True, exist_ok=True)
                if user is not None and os.geteuid() == 0:
                    shutil.chown(data_dir, user)  # the service runs as `user` and writes there
        return [_write(out / name, text) for name, text, _ in rendered]
    except LookupError:
        raise UnitError(
            f"user {user!r} does not exist on this machine; create it or name another with --user"
        ) from None
    except OSError as e:
        raise UnitError(f"cannot write units: {e.filename}: {e.strerror}") from None


def write_node_unit(out_dir: Path | str, text: str) -> Path:
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return _write(Path(out_dir) / NODE_UNIT, text)
    except OSError as e:
        raise UnitError(f"cannot write {NODE_UNIT}: {e.filename}: {e.strerror}") from None


def _write(path: Path, text: str) -> Path:
    # Write beside, then rename: systemd never reads half a unit, even in /etc/systemd/system.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    return path


def build_services(
    placement: Placement,
    state_dir: Path | str,
    progress: Callable[[str], None] = print,
    cache_bound: CacheBound | None = None,
) -> Placement:
    """The placement with its compiled service bundles built, as the node builds its tools bundles
    (runtime/hosting/from_source.py, reused when the sources are unchanged). Python runs from its source."""
    dirs = dict(placement.dirs)
    build_env = dict(placement.build_env)
    for spec in placement.loaded.module.bundle:
        if spec.kind != "service" or spec.language in RUN_FROM_SOURCE:
            continue
        dirs[spec.name], build_env[spec.name] = build_from_source(
            placement.loaded, spec, state_dir, progress, cache_bound
        )
    return replace(placement, dirs=dirs, build_env=build_env)
