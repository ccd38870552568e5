"""Load a `module.toml` and report every problem with file, field and what would be right."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from .model import (
    ENDPOINT_RULE,
    ENV_NAME_RE,
    FAILOVERS,
    KINDS,
    LANGUAGES,
    LIMIT_RANGES,
    MAX_SANDBOX_ENTRIES,
    NAME_RE,
    SEAT_NAME_RE,
    VERSION_RE,
    Artifact,
    BundleManifest,
    Module,
    Seat,
    parse_endpoint,
)

MANIFEST_NAME = "module.toml"
DATABASE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
NAME_RULE = '[a-z][a-z0-9-]{0,62}, e.g. "hello"'
VERSION_RULE = (
    'write a version string such as "0.1.0" (letters, digits, . + _ -, at most 128, not starting with . or -)'
)


def name_problem(value: Any, pattern: re.Pattern[str] = NAME_RE, right: str = NAME_RULE) -> str | None:
    """Why `value` is not a name by the manifest's rule, or None; also used for names from the bus."""
    if value is None:
        return f"is missing; write a name matching {right}"
    if not isinstance(value, str) or not pattern.match(value):
        return f"is {shown(value)}; a name matches {right}"
    return None


def version_problem(value: Any) -> str | None:
    """Why `value` is not a version by the manifest's rule, or None."""
    if not isinstance(value, str) or not VERSION_RE.match(value):
        return f"is {shown(value)}; {VERSION_RULE}"
    return None


def shown(value: Any) -> str:
    """A value as a problem shows it: repr'd (no control characters reach a log), at most 60 characters."""
    if value is None:
        return "missing"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Problem:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


class ManifestError(Exception):
    """A manifest that cannot be used; `problems` holds every reason found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class LoadedModule:
    module: Module
    path: Path  # the module.toml
    root: Path  # the module's folder

    def source_dir(self, bundle: BundleManifest) -> Path:
        return (self.root / bundle.source).resolve()


def manifest_path(path: Path) -> Path:
    path = Path(path)
    return path / MANIFEST_NAME if path.is_dir() else path


def load_module(path: Path | str) -> LoadedModule:
    """Read, validate and convert one manifest; raise ManifestError listing every problem."""
    file = manifest_path(Path(path))
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise ManifestError(
            [Problem(str(file), "-", f"no such file; a module folder holds a {MANIFEST_NAME}")]
        ) from None
    except OSError as e:
        raise ManifestError([Problem(str(file), "-", f"cannot be read: {e.strerror}")]) from None
    return load_module_bytes(raw, file, str(file))


def load_module_bytes(raw: bytes, file: Path, label: str) -> LoadedModule:
    """A manifest's text, as if read from `file` (its folder is the module's), named `label` in problems."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError([Problem(label, "-", "is not UTF-8 text; write the manifest as UTF-8 TOML")]) from None
    except tomllib.TOMLDecodeError as e:
        raise ManifestError([Problem(label, "-", f"is not valid TOML: {e}")]) from None
    except RecursionError:  # tomllib recurses per nested array or table; a manifest never nests this deep
        raise ManifestError(
            [Problem(label, "-", "nests arrays or tables too deeply to read; write a flat manifest")]
        ) from None
    problems = _Validator(label, file.parent.resolve()).module(data)
    if problems:
        raise ManifestError(problems)
    try:
        module = msgspec.convert(data, Module)
    except msgspec.ValidationError as e:  # the validator should have caught it; keep the promise anyway
        raise ManifestError([Problem(label, "-", str(e))]) from None
    return LoadedModule(module=module, path=file, root=file.parent.resolve())


def find_modules(directory: Path | str) -> list[Path]:
    """Every module folder directly under `directory` (or `directory` itself), sorted by name."""
    directory = Path(directory)
    if (directory / MANIFEST_NAME).is_file():
        return [directory]
    return sorted(p for p in directory.iterdir() if (p / MANIFEST_NAME).is_file())


class _Validator:
    """Walks the raw TOML data and collects problems instead of stopping at the first."""

    def __init__(self, file: str, root: Path) -> None:
        self.file = file
        self.root = root
        self.problems: list[Problem] = []

    def add(self, field: str, message: str) -> None:
        self.problems.append(Problem(self.file, field, message))

    def module(self, data: dict[str, Any]) -> list[Problem]:
        known = set(Module.__struct_fields__)
        for key in data:
            if key not in known:
                self.add(_key(key), f"unknown field; a module has {', '.join(sorted(known))}")
        self.name("name", data.get("name"), NAME_RE, NAME_RULE)
        if why := version_problem(data.get("version")):
            self.add("version", why)
        bundles = self.table_list(data, "bundle")
        seen: set[str] = set()
        for i, b in enumerate(bundles):
            name = self.bundle(f"bundle[{i}]", b)
            if name is not None:
                if name in seen:
                    self.add(f"bundle[{i}].name", f'"{name}" is used twice; bundle names are unique in a module')
                seen.add(name)
        seats = self.table_list(data, "seat")
        seen = set[str]()
        for i, s in enumerate(seats):
            self.known_keys(f"seat[{i}]", s, Seat)
            name = s.get("name")
            if self.name(f"seat[{i}].name", name, SEAT_NAME_RE, '[a-z][a-z0-9-]{0,62}, e.g. "memory"'):
                if name in seen:
                    self.add(f"seat[{i}].name", f'"{name}" is declared twice')
                seen.add(str(name))
            if "stateless" in s and not isinstance(s["stateless"], bool):
                self.add(f"seat[{i}].stateless", f"is {_shown(s['stateless'])}; write true or false")
            if "failover" in s:
                if s["failover"] not in FAILOVERS:
                    self.add(
                        f"seat[{i}].failover",
                        f'is {_shown(s["failover"])}; write "local" (the data lives on '
                        'the holder\'s disk) or "replicated" (in a store every node reaches)',
                    )
                elif s.get("stateless") is True:
                    self.add(
                        f"seat[{i}].failover",
                        "a stateless seat keeps no data to fail over; drop failover, or drop stateless = true",
                    )
            if "databases" in s:
                self.databases(f"seat[{i}].databases", s)
        for i, a in enumerate(self.table_list(data, "artifact")):
            self.artifact(f"artifact[{i}]", a)
        if "description" in data and not isinstance(data["description"], str):
            self.add("description", "must be a string")
        return self.problems

    def databases(self, field: str, seat: dict[str, Any]) -> None:
        value = seat["databases"]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.add(field, f'is {_shown(value)}; write a list of SQLite file names, e.g. ["memory.sqlite3"]')
            return
        for v in value:
            if not DATABASE_RE.match(v) or v.startswith(".mesh-"):
                self.add(
                    field,
                    f"{_shown(v)} is not a file name in the module's data folder; write a plain name such as "
                    '"memory.sqlite3" (letters, digits, ".", "_", "-"; no folders, not starting with ".")',
                )
        if len(set(value)) != len(value):
            self.add(field, "names a database twice")
        if value and seat.get("stateless") is True:
            self.add(field, "a stateless seat keeps no data; drop databases, or drop stateless = true")

    def table_list(self, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = data.get(key, [])
        if not isinstance(value, list):
            self.add(key, f"must be an array of tables, written [[{key}]]")
            return []
        tables = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                tables.append(item)
            else:
                self.add(f"{key}[{i}]", f"must be a table, written [[{key}]]")
        return tables

    def known_keys(self, where: str, table: dict[str, Any], struct: type[msgspec.Struct]) -> None:
        known = set(struct.__struct_fields__)
        for key in table:
            if key not in known:
                self.add(f"{where}.{_key(key)}", f"unknown field; allowed: {', '.join(sorted(known))}")

    def name(self, field: str, value: Any, pattern: re.Pattern[str], right: str) -> bool:
        if why := name_problem(value, pattern, right):
            self.add(field, why)
            return False
        return True

    def bundle(self, where: str, b: dict[str, Any]) -> str | None:
        self.known_keys(where, b, BundleManifest)
        ok = self.name(f"{where}.name", b.get("name"), NAME_RE, '[a-z][a-z0-9-]{0,62}, e.g. "tools"')
        kind = b.get("kind")
        if kind not in KINDS:
            self.add(f"{where}.kind", f"is {_shown(kind)}; write one of {', '.join(KINDS)}")
        language = b.get("language")
        if language not in LANGUAGES:
            self.add(f"{where}.language", f"is {_shown(language)}; write one of {', '.join(LANGUAGES)}")
        source = b.get("source")
        if not isinstance(source, str) or not source:
            self.add(
                f"{where}.source",
                f"is {_shown(source)}; write the folder of the bundle's code, relative to module.toml",
            )
        else:
            self.inside(f"{where}.source", source)
        entry = b.get("entry")
        if entry is None:
            self.add(f"{where}.entry", 'is missing; write the argv to run, e.g. ["node", "dist/main.js"]')
        elif not isinstance(entry, list) or not entry or not all(isinstance(x, str) and x for x in entry):
            self.add(f"{where}.entry", f"is {_shown(entry)}; write a non-empty list of strings")
        elif any("\0" in x for x in entry):  # exec refuses NUL in argv; say so now, not at launch
            self.add(f"{where}.entry", "contains a NUL character; write plain argv strings")
        elif entry[0].startswith("/") or ".." in Path(entry[0]).parts:
            self.add(
                f"{where}.entry", f"{entry[0]!r} is outside the bundle; name a program inside it or an interpreter"
            )
        env = b.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) and "\0" not in v for v in env.values()):
            self.add(f"{where}.env", 'must be a table of strings (no NUL), e.g. { LOG_LEVEL = "info" }')
        else:
            for k in env:
                if not ENV_NAME_RE.match(k) or k.startswith("MESH_"):
                    self.add(
                        f"{where}.env.{_key(k)}",
                        "is not a usable variable name (letters, digits, _; MESH_ is the runtime's)",
                    )
        pass_env = b.get("pass_env", [])
        if not isinstance(pass_env, list) or not all(isinstance(x, str) and ENV_NAME_RE.match(x) for x in pass_env):
            self.add(f"{where}.pass_env", "must be a list of environment variable names")
        ranges = [("timeout_ms", 1, 24 * 3600 * 1000), ("max_in_flight", 1, 100_000)]
        ranges += [(field, low, high) for field, (low, high) in LIMIT_RANGES.items()]
        for field, low, high in ranges:
            if field in b:
                v = b[field]
                if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                    self.add(f"{where}.{field}", f"is {_shown(v)}; write a whole number from {low} to {high}")
        for field in ("read", "write"):
            self.sandbox_paths(f"{where}.{field}", b.get(field, []))
        self.network(f"{where}.network", b.get("network", []))
        return b.get("name") if ok else None

    def sandbox_list(self, field: str, value: Any, example: str) -> list[Any]:
        if not isinstance(value, list):
            self.add(field, f"is {_shown(value)}; write a list, e.g. {example}")
            return []
        if len(value) > MAX_SANDBOX_ENTRIES:
            self.add(field, f"has {len(value)} entries; at most {MAX_SANDBOX_ENTRIES}")
            return []
        return value

    def sandbox_paths(self, field: str, value: Any) -> None:
        """`read` / `write`: absolute paths on the node, or relative ones inside the bundle folder."""
        for i, path in enumerate(self.sandbox_list(field, value, '["/srv/models"]')):
            at = f"{field}[{i}]"
            if not isinstance(path, str) or not path:
                self.add(at, f'is {_shown(path)}; write a path, e.g. "/srv/models" or "cache" (inside the bundle)')
            elif "\0" in path or len(path) > 4096:
                self.add(at, f"{_shown(path)} contains a NUL character or is longer than 4096; write a plain path")
            elif path.startswith("~"):
                self.add(at, f"{path!r}: ~ is not expanded; write the absolute path")
            elif ".." in PurePosixPath(path).parts:
                why = "escapes the bundle folder" if not path.startswith("/") else "has a .. in it"
                self.add(at, f"{path!r} {why}; write an absolute path for a folder outside the bundle, without ..")
            elif PurePosixPath(path) == PurePosixPath("/"):
                self.add(at, '"/" would open the whole machine to the bundle; name the folders it needs')

    def network(self, field: str, value: Any) -> None:
        for i, entry in enumerate(self.sandbox_list(field, value, '["127.0.0.1:5432", "*:443"]')):
            if not isinstance(entry, str):
                self.add(f"{field}[{i}]", f"is {_shown(entry)}; {ENDPOINT_RULE}")
                continue
            try:
                parse_endpoint(entry)
            except ValueError as e:
                self.add(f"{field}[{i}]", str(e))

    def inside(self, field: str, rel: str) -> bool:
        if "\0" in rel:  # the OS refuses such a path (resolve() would raise ValueError)
            self.add(field, f"{_shown(rel)} contains a NUL character; write a plain relative path")
            return False
        path = Path(rel)
        if path.is_absolute():
            self.add(field, f"{rel!r} is absolute; write a path relative to module.toml, inside the module")
            return False
        try:
            resolved = (self.root / path).resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11)
            self.add(
                field, f"{rel!r} cannot be resolved (a symlink loop?); write a path to a real folder inside the module"
            )
            return False
        if resolved != self.root and self.root not in resolved.parents:
            self.add(field, f"{rel!r} escapes the module folder; write a path inside it")
            return False
        return True

    def artifact(self, where: str, a: dict[str, Any]) -> None:
        self.known_keys(where, a, Artifact)
        kind = a.get("kind")
        if kind not in ("image", "package", "binary"):
            self.add(f"{where}.kind", f"is {_shown(kind)}; write one of image, package, binary")
        ref, build = a.get("ref", ""), a.get("build")
        if not isinstance(ref, str):
            self.add(f"{where}.ref", 'must be a string such as "docker.io/library/postgres:16"')
        if build is not None and (not isinstance(build, str) or "\0" in build):
            self.add(f"{where}.build", "must be a path string")
        if not ref and build is None:
            self.add(f"{where}.ref", 'is missing; name the third-party artifact, e.g. "docker.io/library/postgres:16"')
        if "base" in a and not isinstance(a["base"], str):
            self.add(f"{where}.base", "must be an image reference string")


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    """A key as TOML would write it, quoted when not bare, so a problem stays one line."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


_shown = shown
