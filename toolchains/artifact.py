"""The bundle artifact: a reproducible `.tar.gz` with `bundle.json` first (docs/artifact.md).

This module is its format: `ArtifactMeta` (bundle.json) with every rule a meta must keep, the
limits a node takes, reading the meta of an artifact. `toolchains/pack.py` makes artifacts;
`toolchains/verify.py`, the security boundary, checks and unpacks them.
"""

from __future__ import annotations

import gzip
import hashlib
import platform
import re
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Iterator

import msgspec

from manifests.check import RULE as RECORD_0188
from manifests.model import ENV_NAME_RE, NAME_RE, VERSION_RE, Kind, Language

FORMAT = 1
META_NAME = "bundle.json"
# entry[0] values the runtime replaces by its own interpreter; any other entry[0] is a bundle path.
INTERPRETERS: frozenset[str] = frozenset({"python", "python3", "node"})
_MAX_META_BYTES = 16 * 1024 * 1024  # a bundle.json bigger than this is an attack, not a manifest
_PLATFORM_RE = re.compile(r"^[a-z0-9_]{1,32}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
CHUNK = 1024 * 1024
MIB = 1024 * 1024
# bundle.json fields that would make an artifact an image: record 0188 is the reason they are refused.
IMAGE_FIELDS: frozenset[str] = frozenset({"image", "images", "dockerfile", "container", "oci"})


class ArtifactLimits(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a node takes from one artifact (its config's `[delivery]` table).

    A real bundle with vendored dependencies can be hundreds of MB; a thousandfold compression
    ratio is not a bundle. The ratio counts only past `ratio_floor_bytes` unpacked, so a small
    bundle of text never meets it."""

    max_artifact_bytes: int = 1024 * MIB  # packed, as fetched
    max_unpacked_bytes: int = 4096 * MIB
    max_ratio: int = 200  # unpacked bytes per packed byte
    ratio_floor_bytes: int = 32 * MIB
    max_members: int = 200_000  # files and links


def is_sha256(value: str) -> bool:
    """A sha256 as every hash here is written: 64 lowercase hex digits."""
    return bool(_SHA256_RE.match(value))


class ArtifactMeta(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """`bundle.json`: what the bundle is and a hash of every file in it."""

    format: int = FORMAT
    module: str
    bundle: str
    version: str
    kind: Kind
    language: Language
    entry: list[str]
    # From the toolchain's BuildOutput.env; "{bundle_dir}" is replaced by the runtime, not here.
    env: dict[str, str] = {}
    os: str | None = None
    arch: str | None = None
    # The CPython ABI ("cp311") a bundle with compiled wheels needs; None when any Python will do.
    python_abi: str | None = None
    files: dict[str, str] = {}  # bundle-relative path -> sha256 hex, every regular file
    links: dict[str, str] = {}  # bundle-relative path -> relative target inside the bundle
    exec: list[str] = []  # files unpacked with mode 0755 (others 0644), sorted
    # The module's module.toml as it was built: timeouts, env, seats travel with the bundle.
    manifest: str = ""


class ArtifactError(Exception):
    """Base of the errors this module raises for expected, explainable problems."""


class ArtifactRefused(ArtifactError):
    """An artifact that must not be unpacked or run; `reason` says what is wrong."""

    def __init__(self, artifact: Path | str, reason: str) -> None:
        self.artifact, self.reason = str(artifact), reason
        super().__init__(f"artifact {self.artifact} refused: {reason}")


class PackRefused(ArtifactError):
    """A staged folder that cannot become an artifact; `reason` says what is wrong."""

    def __init__(self, stage_dir: Path | str, reason: str) -> None:
        self.stage_dir, self.reason = str(stage_dir), reason
        super().__init__(f"cannot pack staged bundle {self.stage_dir}: {reason}")


# ---------------------------------------------------------------------------------------------
# Paths and links: one set of rules, used by the packer and the verifier alike.


def path_problem(path: str) -> str | None:
    """Why `path` is not a clean bundle-relative path ("a/b"), or None when it is."""
    if not path:
        return "the path is empty"
    if path.startswith("/"):
        return "the path is absolute; bundle paths are relative to the bundle folder"
    parts = path.split("/")
    if ".." in parts:
        return "the path contains `..`; bundle paths stay inside the bundle folder"
    if "" in parts or "." in parts:
        return "the path is not in normal form (`//`, `./` or a trailing `/`); write it as a/b/c"
    if "\0" in path:
        return "the path contains a NUL byte"
    return None


def link_problem(path: str, target: str) -> str | None:
    """Why a symlink at `path` pointing to `target` could leave the bundle, or None when it cannot.

    A target is accepted only in normal form with every `..` at its front: the climbing part then
    starts from a real directory (no member lies under a symlink) and is checked against the link's
    depth; the descending part only names entries inside the bundle. `a/../b` is refused because
    `a` could itself be a link that changes where `..` lands.
    """
    if not target:
        return "its target is empty"
    if target.startswith("/"):
        return f"it points to the absolute path {target}; a link must be relative and stay in the bundle"
    parts = target.split("/")
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    rest = parts[ups:]
    if target != "." and ("" in rest or "." in rest or ".." in rest or "\0" in target):
        return f"its target {target!r} is not in normal form; write it as ../dir/name with `..` only in front"
    if ups > path.count("/"):
        return f"its target {target!r} climbs above the bundle folder; a link must stay in the bundle"
    return None


def clean_target(target: str) -> str:
    """Drop `.` parts and repeated or trailing slashes: the same link, written in normal form."""
    if target.startswith("/"):
        return target
    parts = [p for p in target.split("/") if p not in ("", ".")]
    return "/".join(parts) or "."


def _clean_entry(entry0: str) -> str:
    return "/".join(p for p in entry0.split("/") if p not in ("", "."))


def meta_problem(meta: ArtifactMeta) -> str | None:
    """Why `meta` is not a sound bundle.json, or None. Checked before any member is trusted."""
    if meta.format != FORMAT:
        return f"bundle.json has format {meta.format}; this version reads format {FORMAT}"
    for field, value in (("module", meta.module), ("bundle", meta.bundle)):
        if not NAME_RE.match(value):
            return f"bundle.json {field} {value!r} is not a name ([a-z][a-z0-9-]{{0,62}})"
    if not VERSION_RE.match(meta.version):
        return f'bundle.json version {meta.version!r} is not a version string such as "0.1.0"'
    if not meta.entry or not all(isinstance(a, str) and a for a in meta.entry):
        return "bundle.json entry must be a non-empty list of non-empty strings (argv)"
    for name in meta.env:
        if not ENV_NAME_RE.match(name):
            return f"bundle.json env name {name!r} is not an environment variable name"
    if (meta.os is None) != (meta.arch is None):
        return "bundle.json must give both os and arch, or neither"
    for field, part in (("os", meta.os), ("arch", meta.arch)):
        if part is not None and not _PLATFORM_RE.match(part):
            return f'bundle.json {field} {part!r} is not a platform name such as "linux" or "amd64"'
    if meta.python_abi is not None and not re.match(r"^cp3[0-9]{1,2}\Z", meta.python_abi):
        return f'bundle.json python_abi {meta.python_abi!r} is not a CPython ABI such as "cp311"'
    for path, digest in meta.files.items():
        if (why := path_problem(path)) or (why := reserved(path)):
            return f"bundle.json lists file {path!r}: {why}"
        if not _SHA256_RE.match(digest):
            return f"bundle.json gives file {path!r} the hash {digest!r}; a hash is 64 lowercase hex digits"
    for path, target in meta.links.items():
        if (why := path_problem(path)) or (why := reserved(path)):
            return f"bundle.json lists link {path!r}: {why}"
        if path in meta.files:
            return f"bundle.json lists {path!r} both as a file and as a link"
        if why := link_problem(path, target):
            return f"bundle.json lists link {path!r}: {why}"
    every = set(meta.files) | set(meta.links)
    for path in every:
        for parent in _parents(path):
            if parent in every:
                kind = "link" if parent in meta.links else "file"
                return f"bundle.json lists {path!r} under {parent!r}, which is a {kind}, not a folder"
    for path in meta.exec:
        if path not in meta.files:
            return f"bundle.json marks {path!r} executable but does not list it as a file"
    if meta.exec != sorted(set(meta.exec)):
        return "bundle.json exec must be sorted, without repeats"
    return _entry_problem(meta)


def _entry_problem(meta: ArtifactMeta) -> str | None:
    entry0 = meta.entry[0]
    if entry0 in INTERPRETERS:
        return None
    path = _clean_entry(entry0)
    if why := path_problem(path):
        return f"entry[0] {entry0!r} is neither an interpreter ({', '.join(sorted(INTERPRETERS))}) nor a bundle path: {why}"
    if path in meta.links:
        return None  # the link itself was checked to stay inside
    if path not in meta.files:
        return f"entry[0] {entry0!r} is not in the bundle; the entry must be a file the build staged"
    if path not in meta.exec:
        return f"entry[0] {entry0!r} is not executable; the build must stage it with mode 0755"
    return None


def reserved(path: str) -> str | None:
    return f"{META_NAME} at the bundle root is reserved for the artifact's own metadata" if path == META_NAME else None


def _parents(path: str) -> Iterator[str]:
    parts = path.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


def platform_problem(meta: ArtifactMeta) -> str | None:
    """Why this machine cannot run the bundle (another OS, architecture or Python ABI), or None."""
    machine = platform.machine().lower()
    here_arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    here_os = "linux" if sys.platform.startswith("linux") else sys.platform
    if meta.os is not None and (meta.os, meta.arch) != (here_os, here_arch):
        return f"the bundle is built for {meta.os}/{meta.arch}; this node is {here_os}/{here_arch}"
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if meta.python_abi is not None and meta.python_abi != abi:
        return (
            f"the bundle's compiled wheels need Python ABI {meta.python_abi}; this node runs {abi} "
            f"(Python {sys.version_info.major}.{sys.version_info.minor}): build it on a machine with the node's Python"
        )
    return None


def artifact_name(meta: ArtifactMeta) -> str:
    """`<module>-<bundle>-<version>[-<os>-<arch>].tar.gz`."""
    platform = f"-{meta.os}-{meta.arch}" if meta.os is not None else ""
    return f"{meta.module}-{meta.bundle}-{meta.version}{platform}.tar.gz"


def encode_meta(meta: ArtifactMeta) -> bytes:
    """The canonical bytes of bundle.json: sorted keys, no whitespace, a final newline."""
    return msgspec.json.encode(meta, order="sorted") + b"\n"


# ---------------------------------------------------------------------------------------------
# Packing


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read a MiB at a time (call it in a thread from async code)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading and verifying

# What a damaged archive raises from inside gzip, zlib and tarfile.
CORRUPT = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError)


def read_meta(artifact_path: Path) -> ArtifactMeta:
    """Read and check bundle.json only (the first member); the files are not verified."""
    artifact_path = Path(artifact_path)
    try:
        with open_stream(artifact_path) as tar:
            return read_meta_member(artifact_path, tar)
    except CORRUPT as e:
        raise ArtifactRefused(artifact_path, f"it is truncated or corrupt ({e}); build or fetch it again") from None


def open_stream(artifact_path: Path) -> tarfile.TarFile:
    try:
        # Stream mode reads front to back once: no seeking, and a cut archive fails as it is read.
        return tarfile.open(artifact_path, mode="r|gz")
    except FileNotFoundError:
        raise ArtifactRefused(artifact_path, "no such file") from None
    except IsADirectoryError:
        raise ArtifactRefused(artifact_path, "it is a folder; an artifact is a .tar.gz file") from None


def read_meta_member(artifact_path: Path, tar: tarfile.TarFile) -> ArtifactMeta:
    first = tar.next()
    if first is None:
        raise ArtifactRefused(artifact_path, f"the archive is empty; it must start with {META_NAME}")
    if first.name != META_NAME or not first.isreg():
        raise ArtifactRefused(
            artifact_path, f"its first member is {first.name!r}; an artifact starts with the file {META_NAME}"
        )
    if first.size > _MAX_META_BYTES:
        raise ArtifactRefused(artifact_path, f"{META_NAME} is {first.size} bytes; at most {_MAX_META_BYTES} are read")
    f = tar.extractfile(first)
    assert f is not None  # a regular file always has content
    data = f.read()
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise ArtifactRefused(artifact_path, f"{META_NAME} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ArtifactRefused(artifact_path, f"{META_NAME} must hold a JSON object")
    if raw.get("format") != FORMAT:
        raise ArtifactRefused(
            artifact_path, f"{META_NAME} has format {raw.get('format')!r}; this version reads format {FORMAT}"
        )
    if image := sorted(IMAGE_FIELDS & set(raw)):
        raise ArtifactRefused(artifact_path, f"{META_NAME} has the field {', '.join(image)}: {RECORD_0188}")
    try:
        meta = msgspec.convert(raw, ArtifactMeta)
    except msgspec.ValidationError as e:
        raise ArtifactRefused(artifact_path, f"{META_NAME} is invalid: {e}") from None
    if why := meta_problem(meta):
        raise ArtifactRefused(artifact_path, why)
    return meta
