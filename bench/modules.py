"""Module folders for the benchmark's nodes: echo modules and renamed copies of hello-* bundles.

A copy keeps the bundle's source as it is; only the module's name changes, its seats are
dropped (one holder per seat per node: 35 copies cannot all hold `clock`), and relative paths
to the SDKs (`../../../sdk/go` in go.mod, Cargo.toml's path dependency, package.json's
`file:` link) are rewritten so that they still reach this checkout's `sdk/` from the new place.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ECHO_CHILD = BENCH / "echo_child.py"
LANGUAGES = ("python", "go", "c", "rust", "typescript")  # the hello-<language> bundles, in this order

_SKIP = shutil.ignore_patterns("target", "node_modules", "dist", "__pycache__", ".git", "*.egg-info")
_REL_SDK = re.compile(r"(?:\.\./)+sdk/")
_TEXT_FILES = ("go.mod", "Cargo.toml", "package.json", "package-lock.json", "tsconfig.json", "tsconfig.build.json")


@dataclass(frozen=True)
class Target:
    """One module the benchmark calls: its subject's module, the tool and the arguments."""

    module: str
    kind: str  # echo | python | go | c | rust | typescript
    tool: str
    arguments: bytes


def echo_module(root: Path, name: str, env: dict[str, str] | None = None) -> Target:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ECHO_CHILD, folder / "echo_child.py")
    env_line = ", ".join(f'{k} = "{v}"' for k, v in (env or {}).items())
    (folder / "module.toml").write_text(
        f'name = "{name}"\nversion = "0.1.0"\ndescription = "The benchmark\'s raw echo child."\n\n'
        '[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "python"\nsource = "."\n'
        f'entry = ["python", "echo_child.py"]\nenv = {{ {env_line} }}\n'
    )
    return Target(name, "echo", "echo", b'{"text":"hello"}')


def hello_source(language: str) -> Path | None:
    folder = ROOT / "bundles" / f"hello-{language}"
    return folder if (folder / "module.toml").is_file() else None


def hello_copy(root: Path, language: str, name: str, tool: str = "greet") -> Target:
    """A copy of bundles/hello-<language> named `name`; raises FileNotFoundError when there is none."""
    source = hello_source(language)
    if source is None:
        raise FileNotFoundError(f"bundles/hello-{language} is not in this checkout")
    folder = root / name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(source, folder, ignore=_SKIP, symlinks=True)
    manifest = folder / "module.toml"
    text = manifest.read_text()
    text = re.sub(r'(?m)^name\s*=\s*"[^"]*"', f'name = "{name}"', text, count=1)
    text = re.sub(r"(?ms)^\[\[seat\]\].*?(?=^\[|\Z)", "", text)
    manifest.write_text(text)
    for path in folder.rglob("*"):
        if path.name in _TEXT_FILES and path.is_file():
            _rewrite_sdk_paths(path, source / path.relative_to(folder))
    return Target(name, language, tool, b'{"name":"Ada"}')


def _rewrite_sdk_paths(copy: Path, original: Path) -> None:
    text = copy.read_text()

    def fix(match: re.Match[str]) -> str:
        target = (original.parent / match.group(0)).resolve()
        if not target.is_relative_to(ROOT):
            return match.group(0)
        return os.path.relpath(target, copy.parent) + "/"

    fixed = _REL_SDK.sub(fix, text)
    if fixed != text:
        copy.write_text(fixed)
