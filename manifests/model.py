"""The `module.toml` format as msgspec structs.

These structs are what the rest of the project sees; `manifests.load` turns a file into them
and reports every problem it finds first, so nothing downstream meets an invalid manifest.
"""

from __future__ import annotations

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


FAILOVERS: tuple[str, ...] = ("local", "replicated")


class Seat(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    # A stateless seat may be served by several nodes at once behind the queue group; any
    # other seat is held by one node in the whole mesh, through a lease.
    stateless: bool = False
    # Where a stateful seat's data lives: "local", on the holder's disk (it moves only with an
    # operator's `meshctl seat move`); "replicated", in a store every node reaches (e.g.
    # JetStream), so a live node takes the seat over by itself when its holder's lease expires.
    failover: Literal["local", "replicated"] = "local"


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
