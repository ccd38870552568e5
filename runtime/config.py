"""The node's configuration: a TOML file, overridden by command-line flags.

```toml
name = "node-a"
state_dir = "/var/lib/mesh-node"
manifests = "/srv/modules"         # serve every module folder under it, from source
child_user = "mesh"                # run children as this user (needs root)
secrets = "/etc/mesh/secrets.toml"  # API keys per bundle, readable by the node alone (runtime/hosting/secrets.py)

[nats]
url = "nats://10.0.0.1:4222,nats://10.0.0.2:4222"   # none: start the embedded server
user = "node"                       # or token, creds, nkey_seed
password = "..."
tls_ca = "/etc/mesh/ca.pem"

[restart]
max_restarts = 5
window_s = 60

[health]
ping_interval_s = 5

[delivery]                          # what the node takes from one delivered artifact
max_artifact_bytes = 1073741824
max_unpacked_bytes = 4294967296
max_ratio = 200
max_members = 200000

[identity]
local = "ops/alice"                 # the node's own caller: the embedded bus's operator, a bus without accounts
delegates = { "faces/mcp" = "mcp", "web/console" = "console" }   # callers that pass the person behind a call
# mcp_faces = ["faces/mcp"]         # the same as delegates with "mcp" (the older name)

[console]
operators = ["person:https%3A%2F%2Fidp.example/anna"]   # who may restart bundles through a console

[seats]
lease_ttl_s = 10                    # a dead holder's lease expires after this

[[nats.caller]]                     # embedded bus only: a caller account importing the mesh
account = "alice"
user = "alice"
password = "..."                    # none: generated into <state_dir>/callers/<user>.password

[services]
host = "auto"                       # auto | node | systemd: who runs service bundles

[metrics]
listen = "127.0.0.1:9464"           # Prometheus text at http://127.0.0.1:9464/metrics (or --metrics ADDR)

[catalog]                           # this node's entries in the mesh-catalog bucket (docs/scale.md)
beat_s = 5                          # its heartbeat; readers drop it three beats after the last
replicas = 1                        # of the bucket, when this node makes it: 3 in a cluster

[sandbox]                           # every child confined by the kernel (docs/internals.md, "Confinement")
required = true                     # false: where the kernel lacks Landlock, children run unconfined (one WARNING)

[build_cache]                       # what the toolchains keep between builds (MESH_TOOLCHAIN_CACHE)
max_age_days = 14                   # a kept build folder unused this long is removed
max_size_gb = 10                    # per toolchain: beyond it the least recently used go first
```
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from launcher.bundle import HealthPolicy, RestartPolicy
from manifests.load import name_problem
from runtime.calls.desk import CallSettings
from runtime.wire.identity import DELEGATE_VIAS, Via, check_local, parse_listed
from toolchains.artifact import ArtifactLimits
from toolchains.cache_bound import CacheBound, bound_problem

# The embedded bus's own account and the user its nodes connect as.
MESH_ACCOUNT = "MESH"
MESH_USER = "mesh-node"
# The embedded bus's own callers: the operator's calls (the node's OS user: the local identity)
# the face (`meshctl mcp`, a delegate) and the console (`meshctl console`, a delegate that also reads
# the nodes' status and asks their restarts, which the node checks against `[console] operators`).
LOCAL_ACCOUNT = "LOCAL"
LOCAL_USER = "mesh-local"
FACE_ACCOUNT = "faces"
FACE_USER = "mesh-mcp"
CONSOLE_ACCOUNT = "CONSOLES"
CONSOLE_USER = "mesh-console"
RESERVED_ACCOUNTS = (MESH_ACCOUNT, LOCAL_ACCOUNT, CONSOLE_ACCOUNT)
RESERVED_USERS = (MESH_USER, LOCAL_USER, FACE_USER, CONSOLE_USER)
# Where a node run by systemd keeps its state (its unit's default; meshctl finds it there too).
SYSTEM_STATE_DIR = "/var/lib/mesh-node"
ACCOUNT_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


class CallerAccount(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    account: str
    user: str
    password: str | None = None


class NatsConfig(msgspec.Struct, forbid_unknown_fields=True):
    url: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None  # a .creds file (JWT + nkey seed)
    nkey_seed: str | None = None  # a file holding an nkey seed
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # The embedded server's port when no url is set; 0 picks a free one.
    embedded_port: int = 4222
    # Embedded server only: caller accounts importing the mesh's subjects (see runtime/bus/accounts.py).
    caller: list[CallerAccount] = []


class IdentityConfig(msgspec.Struct, forbid_unknown_fields=True):
    # The node's own caller ("account" or "account/user"; default the OS user running the node):
    # the embedded bus's operator (`meshctl call` by the node's user), and every caller of a bus
    # whose stamps the node cannot believe.
    local: str | None = None
    # Delegates: server-stamped callers ("account/user", or "account" for all its users) that
    # pass the person behind each call (`Mesh-Person`), with their channel: "mcp" (an MCP face)
    # or "console" (a web console). The embedded bus's own face is one without being listed.
    delegates: dict[str, Via] = {}
    # The older name: delegates whose channel is "mcp".
    mcp_faces: list[str] = []

    def listed(self) -> dict[tuple[str, str | None], Via]:
        """Every delegate as (account, user) -> channel (`delegates` over `mcp_faces`)."""
        found: dict[tuple[str, str | None], Via] = {parse_listed(f): "mcp" for f in self.mcp_faces}
        found.update({parse_listed(k): v for k, v in self.delegates.items()})
        return found


class ConsoleConfig(msgspec.Struct, forbid_unknown_fields=True):
    # People who may restart a bundle through a console (`meshctl console`): person ids
    # ("person:<iss>/<sub>", as the modules see them). The node's local person (the OS user who runs
    # the node, logged in locally on a console on this machine) is one without being listed.
    operators: list[str] = []


class SeatsConfig(msgspec.Struct, forbid_unknown_fields=True):
    # How long a stateful seat's lease lives without renewal: a dead holder's seat frees after it.
    # Fixed when the lease bucket is made; a node finding another value uses the bucket's.
    lease_ttl_s: float = 10.0
    # Replicated seats (runtime/seats/replica.py): replicas of each seat's JetStream object store
    # bucket (0: the bus's cluster size, at most 3), how often the holder's Litestream ships its
    # writes (the RPO: writes answered longer ago than this survive the holder's death), and the
    # litestream binary ("" finds it beside the node's Python, then on PATH).
    replicas: int = 0
    sync_interval_ms: int = 1000
    litestream: str = ""


class CatalogConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The node's entries in the mesh-catalog bucket (runtime/node/catalog.py, docs/scale.md)."""

    # How often the node beats; readers drop it three beats after its last.
    beat_s: float = 5.0
    # Replicas of the bucket when this node is the one to make it: 3 in a cluster of 3 servers or more.
    replicas: int = 1
    # The bucket's bound when this node makes it; a server with strict JetStream reserves it whole.
    max_bytes: int = 1024 * 1024 * 1024

    def beat_ttl_s(self) -> int:
        return max(1, round(3 * self.beat_s))


class ServicesConfig(msgspec.Struct, forbid_unknown_fields=True):
    """How the node runs service bundles (runtime/hosting/services.py)."""

    # auto: as systemd units where systemd runs the machine and started the node, and unit_dir is writable, else
    # supervised by the node itself; node / systemd: that one (systemd without systemd is named).
    host: Literal["auto", "node", "systemd"] = "auto"
    # Runtime units: the node's own unit keeps /etc read-only (ProtectSystem=full), and the node
    # writes them again at every start, so they need not outlive a reboot.
    unit_dir: str = "/run/systemd/system"


class MetricsConfig(msgspec.Struct, forbid_unknown_fields=True):
    # HOST:PORT of Prometheus' /metrics (runtime/node/metrics.py); none: no metrics endpoint.
    listen: str | None = None


class SandboxConfig(msgspec.Struct, forbid_unknown_fields=True):
    """Every child the node starts is confined (launcher/sandbox.py, docs/internals.md)."""

    # True: a child whose confinement this machine cannot give (no Landlock, no sandbox helper)
    # is refused with the reason and the other bundles serve. False: it runs with what there is,
    # the node says so once (a WARNING) and in `meshctl node status`.
    required: bool = True


class NodeConfig(msgspec.Struct, forbid_unknown_fields=True):
    name: str = ""
    state_dir: str = ""
    manifests: str | None = None
    child_user: str | None = None
    child_group: str | None = None
    secrets: str | None = None  # a file of secrets per bundle, mode 0600 (runtime/hosting/secrets.py)
    queue_group: str = "mesh"
    # Watch this node's membership in JetStream KV and run what is delivered to it.
    membership: bool = True
    # How long a graceful stop waits for calls in flight before it stops the children.
    drain_timeout_s: float = 30.0
    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    # The launcher's own policies, read as they are: their defaults are written there, once.
    restart: RestartPolicy = msgspec.field(default_factory=RestartPolicy)
    health: HealthPolicy = msgspec.field(default_factory=HealthPolicy)
    calls: CallSettings = msgspec.field(default_factory=CallSettings)  # the bus call protocol (docs/bus.md)
    delivery: ArtifactLimits = msgspec.field(default_factory=ArtifactLimits)
    identity: IdentityConfig = msgspec.field(default_factory=IdentityConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    seats: SeatsConfig = msgspec.field(default_factory=SeatsConfig)
    services: ServicesConfig = msgspec.field(default_factory=ServicesConfig)
    build_cache: CacheBound = msgspec.field(default_factory=CacheBound)  # toolchains/cache_bound.py
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    catalog: CatalogConfig = msgspec.field(default_factory=CatalogConfig)
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)


class ConfigError(Exception):
    pass


def default_state_dir() -> Path:
    base = os.environ.get("MESH_STATE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_STATE_HOME")
    user = Path(xdg) / "mesh-node" if xdg else Path.home() / ".local" / "state" / "mesh-node"
    # A node run by systemd keeps its state in /var/lib; meshctl finds it there too.
    system = Path(SYSTEM_STATE_DIR)
    try:
        if not user.exists() and (system / "bus.json").exists():
            return system
    except PermissionError:  # the system node's state is its user's alone: not this user's node
        pass
    return user


def load_config(path: str | Path | None) -> NodeConfig:
    if path is None:
        config = NodeConfig()
    else:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        try:
            config = msgspec.convert(data, NodeConfig)
        except msgspec.ValidationError as e:
            raise ConfigError(f"{path}: {e}") from None
        problem = _problem(config)
        if problem:
            raise ConfigError(f"{path}: {problem}")
    return config


def node_name_problem(name: str) -> str | None:
    """Why `name` cannot name a node, or None: a node's name is in subjects and KV keys, so it
    follows the manifest's name rule (no `*`, `>`, `.` or space)."""
    why = name_problem(name)
    return f"the node name {why}" if why else None


def node_name_from_host(host: str) -> str:
    """The host's name made a node name: its first label, lower case, other characters as `-`."""
    name = re.sub(r"[^a-z0-9-]", "-", host.split(".")[0].lower())[:62].strip("-")
    if not name:
        return "node"
    return name if name[0].isalpha() else "n" + name


def _problem(config: NodeConfig) -> str | None:
    """What msgspec cannot say about a config: values that parse but cannot be used."""
    if config.identity.local is not None and (why := check_local(config.identity.local)):
        return f"identity.local: {why}"
    for face in config.identity.mcp_faces:
        if why := check_local(face):
            return f"identity.mcp_faces: {why}"
    for listed, via in config.identity.delegates.items():
        if why := check_local(listed):
            return f"identity.delegates: {why}"
        if via not in DELEGATE_VIAS:
            return f'identity.delegates: {listed!r} = {via!r}; a delegate\'s channel is "mcp" or "console"'
    for listed in config.console.operators:
        if not listed.startswith("person:") or "/" not in listed or not listed.isprintable():
            return f'console.operators: {listed!r} is not a person id; write "person:<issuer>/<subject>", e.g. "person:https%3A%2F%2Fidp.example/anna"'
    if not 1 <= config.seats.lease_ttl_s <= 3600:
        return f"seats.lease_ttl_s: is {config.seats.lease_ttl_s}; write seconds from 1 to 3600"
    if why := bound_problem(config.build_cache):
        return why
    if not 1 <= config.catalog.beat_s <= 600:
        return f"catalog.beat_s: is {config.catalog.beat_s}; write seconds from 1 to 600"
    if not 1 <= config.catalog.replicas <= 5:
        return f"catalog.replicas: is {config.catalog.replicas}; write 1 to 5 (3 in a cluster of 3 servers or more)"
    if config.metrics.listen is not None and (why := listen_problem(config.metrics.listen)):
        return f"metrics.listen: {why}"
    seen: set[str] = set()
    for i, c in enumerate(config.nats.caller):
        for field, value in (("account", c.account), ("user", c.user)):
            if not ACCOUNT_NAME_RE.match(value):
                return f'nats.caller[{i}].{field}: is {value!r}; write a name of letters, digits, - and _, e.g. "alice"'
        if why := reserved_problem(c.account, c.user):
            return f"nats.caller[{i}]: {why}"
        if c.user in seen:
            return f"nats.caller[{i}].user: {c.user!r} is used twice; one user names one caller"
        seen.add(c.user)
        if config.nats.url:
            return (
                f"nats.caller[{i}]: caller accounts are written into the embedded server's config; with "
                "nats.url set, configure accounts on that server (see README, Who is calling)"
            )
    return None


def listen_problem(text: str) -> str | None:
    """Why `text` is not HOST:PORT to listen on (port 0: any free one), or None."""
    _host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        return f"is {text!r}; write HOST:PORT, e.g. 127.0.0.1:9464"
    return None


def reserved_problem(account: str, user: str) -> str | None:
    """Why a caller may not have this account or user (the embedded bus's own), or None."""
    if account.upper() in RESERVED_ACCOUNTS or user in RESERVED_USERS:
        return (
            f"{', '.join(RESERVED_ACCOUNTS)} (accounts) and {', '.join(RESERVED_USERS)} (users) are the mesh's own; "
            "name the caller otherwise"
        )
    return None


def finish(config: NodeConfig) -> NodeConfig:
    """Fill what was left open: the node's name and its state folder; refuse a name that is not one."""
    name = config.name or node_name_from_host(socket.gethostname())
    if why := node_name_problem(name):
        raise ConfigError(why)
    state = config.state_dir or str(default_state_dir())
    return msgspec.structs.replace(config, name=name, state_dir=str(Path(state).absolute()))
