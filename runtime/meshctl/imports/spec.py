"""SPEC of `meshctl module import`: `npm:<pkg>@<ver>`, `pypi:<pkg>==<ver>`, `cargo:<crate>@<ver>`, `go:<path>@<ver>`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from runtime.meshctl.errors import Refused

# Names as each registry allows them; anything else is refused before a client sees it.
_NAME_RE = {
    "npm": re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]{0,213}\Z"),
    "pypi": re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?\Z"),
    "cargo": re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}\Z"),
    "go": re.compile(r"^[a-z0-9.-]+\.[a-z]{2,}(/[A-Za-z0-9._~+-]+)+\Z"),
}
_VERSION_RE = re.compile(r"^v?[0-9][0-9A-Za-z.+-]{0,100}\Z")
_SEPARATOR = {"npm": "@", "pypi": "==", "cargo": "@", "go": "@"}
EXAMPLES = (
    "npm:@modelcontextprotocol/server-everything@2026.8.31, pypi:mcp-server-time==2026.10.19, "
    "cargo:rust-mcp-filesystem@0.4.5, go:github.com/modelcontextprotocol/go-sdk/examples/server/memory@v1.8.0"
)


class SpecError(Refused):
    def __init__(self, spec: str, reason: str) -> None:
        self.spec, self.reason = spec, reason
        super().__init__(f"import spec {spec!r}: {reason}; write it as one of {EXAMPLES} (no version: the newest)")


@dataclass(frozen=True)
class ImportSpec:
    registry: str  # npm | pypi | cargo | go
    package: str
    version: str | None  # None: the newest, found by the registry's client

    def pinned(self, version: str) -> str:
        return f"{self.registry}:{self.package}{_SEPARATOR[self.registry]}{version}"


def parse_spec(spec: str) -> ImportSpec:
    registry, colon, rest = spec.partition(":")
    if not colon or registry not in _NAME_RE:
        raise SpecError(spec, f"it starts with {registry + colon!r}, not npm:, pypi:, cargo: or go:")
    separator = _SEPARATOR[registry]
    # npm's scope starts with "@": the version separator is the last "@" after the first character.
    cut = rest.rfind(separator, 1) if separator == "@" else rest.find(separator)
    package, version = (rest[:cut], rest[cut + len(separator) :]) if cut > 0 else (rest, None)
    if registry == "pypi" and version is None and "@" in rest:
        raise SpecError(spec, "a PyPI version is written with ==, e.g. pypi:mcp-server-time==2026.10.19")
    if not _NAME_RE[registry].match(package):
        raise SpecError(spec, f"{package!r} is not a {registry} package name")
    if version is not None and not _VERSION_RE.match(version):
        raise SpecError(spec, f"{version!r} is not an exact version (no ranges: a pin is what makes it reproducible)")
    if registry == "go" and version is not None and not version.startswith("v"):
        raise SpecError(spec, f"Go versions start with v: {package}@v{version}")
    return ImportSpec(registry, package, version)
