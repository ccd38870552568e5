"""The `module.toml` format as msgspec structs.

These structs are what the rest of the project sees; `manifests.load` turns a file into them
and reports every problem it finds first, so nothing downstream meets an invalid manifest.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

import msgspec

# `\Z`, not `$`: `$` also matches before a trailing newline, so "hello\n" would pass as a name.
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}\Z")
# Tool names as MCP allows them; a `<seat>.<verb>` name has exactly one dot.
SEAT_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}\Z")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# A version is a folder name on every node that runs it: it starts with a letter or digit (never
# "." or ".."), and is short enough for any file system.
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,127}\Z")

Kind = Literal["tools", "service", "step"]
Language = Literal["python", "typescript", "go", "rust", "c"]
KINDS: tuple[str, ...] = ("tools", "service", "step")
LANGUAGES: tuple[str, ...] = ("python", "typescript", "go", "rust", "c")
COMPILED_LANGUAGES: frozenset[str] = frozenset({"go", "rust", "c"})


class BundleManifest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    kind: Kind
    language: Language
    source: str
    entry: list[str]
    env: dict[str, str] = {}
    # Names of the node's own environment variables this bundle is given; nothing else passes.
    pass_env: list[str] = []
    # tools: the time a call may take before 504; step: the time the step may run before it is
    # killed and its version refused; service: unused.
    timeout_ms: int = 30_000
    # Calls in flight on one child at once; more wait their turn inside their timeout.
    max_in_flight: int = 256
    # What the bundle's child may reach beyond its own folder (read and execute), its module's
    # data folder and a private temporary folder (read and write), enforced by the kernel
    # (docs/internals.md, "Confinement"): extra paths, absolute or relative to the bundle folder
    # (inside it); the TCP destinations it may connect to ("HOST:PORT"), none: no network.
    read: list[str] = []
    write: list[str] = []
    network: list[str] = []
    # Resource limits; None: the node's defaults (launcher/sandbox.py).
    max_memory_mb: int | None = None
    max_processes: int | None = None
    max_open_files: int | None = None

    def endpoints(self) -> list[tuple[str, int]]:
        """`network` as (host, port) pairs; the manifest was checked when it was loaded."""
        return [parse_endpoint(text) for text in self.network]


FAILOVERS: tuple[str, ...] = ("local", "replicated")

# The ranges a manifest's limits are checked against (the node's defaults sit inside them).
LIMIT_RANGES: dict[str, tuple[int, int]] = {
    "max_memory_mb": (16, 1024 * 1024),
    "max_processes": (1, 65536),
    "max_open_files": (16, 1024 * 1024),
}
MAX_SANDBOX_ENTRIES = 64  # per list (read, write, network)
_HOST_NAME = re.compile(
    r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
ENDPOINT_RULE = (
    'write "HOST:PORT": HOST an IP address (IPv6 in brackets), a host name or *, PORT from 1 to 65535, '
    'e.g. "127.0.0.1:5432" or "*:443"'
)


def parse_endpoint(text: str) -> tuple[str, int]:
    """One `network` entry as (host, port); ValueError saying what is wrong and what is right."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{text!r} has no port; {ENDPOINT_RULE}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address; {ENDPOINT_RULE}") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} has no port; {ENDPOINT_RULE}")
        if ":" in host:
            raise ValueError(f'{text!r}: an IPv6 address is written in brackets, e.g. "[::1]:5432"')
        if host != "*" and not _HOST_NAME.match(host):
            raise ValueError(f"{host!r} is not a host; {ENDPOINT_RULE}")
        if host.replace(".", "").isdigit():
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IPv4 address; {ENDPOINT_RULE}") from None
    if port == "*":
        raise ValueError(f"{text!r}: the kernel allows TCP by port (Landlock), not every port; name the ports")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} is not a number from 1 to 65535; {ENDPOINT_RULE}")
    return host, int(port)


class Seat(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    # A stateless seat may be served by several nodes at once behind the queue group; any
    # other seat is held by one node in the whole mesh, through a lease.
    stateless: bool = False
    # Where a stateful seat's data lives: "local", on the holder's disk (it moves only with an
    # operator's `meshctl seat move`); "replicated", in a store every node reaches (e.g.
    # JetStream), so a live node takes the seat over by itself when its holder's lease expires.
    failover: Literal["local", "replicated"] = "local"
    # The seat's SQLite files, relative to the module's data folder: a "replicated" seat's holder
    # replicates them continuously (Litestream, runtime/seats/replica.py) and a taking node restores
    # them. A replicated seat without databases keeps its data outside the folder.
    databases: list[str] = []


class Artifact(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    kind: Literal["image", "package", "binary"]
    ref: str = ""
    # A build context (folder or Dockerfile) for an image; inside the module it is own code.
    build: str | None = None
    # The base image a build starts from, when the manifest says so.
    base: str | None = None


class Module(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    version: str
    bundle: list[BundleManifest] = []
    seat: list[Seat] = []
    artifact: list[Artifact] = []
    description: str = ""

    def tools_bundles(self) -> list[BundleManifest]:
        return [b for b in self.bundle if b.kind == "tools"]

    def service_bundles(self) -> list[BundleManifest]:
        return [b for b in self.bundle if b.kind == "service"]

    def step_bundles(self) -> list[BundleManifest]:
        return [b for b in self.bundle if b.kind == "step"]

    def seat_names(self) -> list[str]:
        return [s.name for s in self.seat]
