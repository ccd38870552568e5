#!/usr/bin/env python3
"""Count each SDK's own source and write docs/sdk-sizes.md (record 0188: "its size is in the
mesh's records"). `--check` compares instead of writing and exits 1 when the file is stale.

What counts: the source files of `sdk/<language>/` by extension, without tests (Rust's inline
`#[cfg(test)]` modules too), fixtures, build outputs (dist, target, build, node_modules,
egg-info, caches), lock files, package manifests and READMEs. Lines of code are the lines that hold something besides blanks and
comments (Python docstrings count as comments, as C-family doc comments do); the scan is
rough (it knows line comments, block comments and one-line strings, not every literal form).
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import re
import sys
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "sdk-sizes.md"
LANGUAGES = ("python", "typescript", "go", "rust", "c")
EXTENSIONS = {
    "python": (".py",),
    "typescript": (".ts", ".mts", ".js", ".mjs"),
    "go": (".go",),
    "rust": (".rs",),
    "c": (".c", ".h"),
}
SKIP_DIRS = {
    "test",
    "tests",
    "fixtures",
    "testdata",
    "examples",
    "benches",
    "node_modules",
    "dist",
    "target",
    "build",
    "vendor",
    "__pycache__",
    ".venv",
}


@dataclass(frozen=True)
class FileCount:
    path: str  # relative to the repository
    lines: int
    code: int


# --- which files ------------------------------------------------------------------------------
def _is_test(name: str) -> bool:
    return (
        name.endswith(("_test.go", ".d.ts"))
        or name.startswith("test_")
        or name.endswith("_test.py")
        or re.search(r"\.(test|spec)\.[cm]?[jt]s$", name) is not None
    )


def source_files(sdk: Path, language: str) -> list[Path]:
    found = []
    for path in sorted(sdk.rglob("*")):
        rel = path.relative_to(sdk)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if path.is_file() and path.suffix in EXTENSIONS[language] and not _is_test(path.name):
            found.append(path)
    return found


# --- counting ---------------------------------------------------------------------------------
def python_code_lines(text: str) -> int:
    """Lines holding a token that is not a comment or a docstring (a statement that is a lone string)."""
    code: set[int] = set()
    statement: list[tokenize.TokenInfo] = []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))
    for tok in tokens:
        if tok.type in skip:
            if tok.type == tokenize.NEWLINE:
                if not (len(statement) == 1 and statement[0].type == tokenize.STRING):
                    for t in statement:
                        code.update(range(t.start[0], t.end[0] + 1))
                statement = []
            continue
        statement.append(tok)
    return len(code)


def c_family_code_lines(text: str, language: str) -> int:
    """Lines with something left once // and /* */ comments are taken out; strings are skipped
    over so a "//" inside one is not a comment."""
    count = 0
    in_block = False
    for line in text.splitlines():
        i, has_code = 0, False
        while i < len(line):
            if in_block:
                end = line.find("*/", i)
                if end < 0:
                    i = len(line)
                else:
                    in_block, i = False, end + 2
                continue
            rest = line[i:]
            if rest.startswith("//"):
                break
            if rest.startswith("/*"):
                in_block, i = True, i + 2
                continue
            ch = line[i]
            if ch in '"`' or (ch == "'" and _quote_opens_string(line, i, language)):
                i = _string_end(line, i)
                has_code = True
                continue
            if not ch.isspace():
                has_code = True
            i += 1
        count += has_code
    return count


def _quote_opens_string(line: str, i: int, language: str) -> bool:
    # In Rust a ' is a lifetime ('a) unless it is a char literal ('x', '\n').
    if language != "rust":
        return True
    return re.match(r"'(\\.|[^\\'])'", line[i:]) is not None


def _string_end(line: str, i: int) -> int:
    quote, i = line[i], i + 1
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        if line[i] == quote:
            return i + 1
        i += 1
    return len(line)


def without_rust_tests(text: str) -> str:
    """Rust keeps unit tests inside the source file: drop each top-level `#[cfg(test)] mod`
    (rustfmt style: the module opens at column 0 and closes with a `}` alone at column 0)."""
    kept, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if (
            lines[i].strip() == "#[cfg(test)]"
            and i + 1 < len(lines)
            and re.match(r"(pub\s+)?mod\s+\w+\s*\{\s*$", lines[i + 1])
        ):
            i += 2
            while i < len(lines) and lines[i] != "}":
                i += 1
            i += 1
            continue
        kept.append(lines[i])
        i += 1
    return "\n".join(kept) + "\n"


def count_file(path: Path, language: str) -> FileCount:
    text = path.read_text("utf-8", errors="replace")
    if language == "rust":
        text = without_rust_tests(text)
    lines = len(text.splitlines())
    code = python_code_lines(text) if language == "python" else c_family_code_lines(text, language)
    return FileCount(str(path.relative_to(REPO)), lines, code)


# --- the wrapped library, read from the SDK's own package manifest ------------------------------
def wrapped_library(sdk: Path, language: str) -> str:
    try:
        if language == "python":
            deps = tomllib.loads((sdk / "pyproject.toml").read_text())["project"].get("dependencies", [])
            found = [d for d in deps if re.match(r"mcp\b", d)]
            return f"`{found[0]}` (PyPI, the official MCP Python SDK)" if found else "-"
        if language == "typescript":
            deps = json.loads((sdk / "package.json").read_text()).get("dependencies", {})
            name = "@modelcontextprotocol/sdk"
            return f"`{name}` {deps[name]} (npm, the official MCP TypeScript SDK)" if name in deps else "-"
        if language == "go":
            m = re.search(
                r"^\s*(?:require\s+)?(github\.com/modelcontextprotocol/go-sdk)\s+(\S+)",
                (sdk / "go.mod").read_text(),
                re.M,
            )
            return f"`{m[1]}` {m[2]} (the official MCP Go SDK)" if m else "-"
        if language == "rust":
            deps = tomllib.loads((sdk / "Cargo.toml").read_text()).get("dependencies", {})
            rmcp = deps.get("rmcp")
            version = rmcp.get("version") if isinstance(rmcp, dict) else rmcp
            return f"`rmcp` {version} (crates.io, the official MCP Rust SDK)" if rmcp else "-"
        if language == "c":
            return "none: C has no sound MCP library; the loop is written on jansson (`libjansson-dev`)"
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        pass
    return "-"


# --- the document -------------------------------------------------------------------------------
def render() -> str:
    rows, details = [], []
    for language in LANGUAGES:
        sdk = REPO / "sdk" / language
        if not sdk.is_dir():
            rows.append(f"| {language} | - | - | - | not written yet |")
            continue
        counts = [count_file(p, language) for p in source_files(sdk, language)]
        rows.append(
            f"| {language} | {len(counts)} | {sum(c.lines for c in counts)} | {sum(c.code for c in counts)} "
            f"| {wrapped_library(sdk, language)} |"
        )
        details.append(f"\n### {language}\n\n| file | lines | lines of code |\n|---|---:|---:|")
        details += [f"| `{c.path}` | {c.lines} | {c.code} |" for c in counts]
    return (
        "# SDK sizes\n\n"
        "Record 0188 asks that each SDK stay thin and that its size be in the mesh's records: this is\n"
        "that record. Generated by `python scripts/sdk_sizes.py`; `tests/test_sdk_sizes.py` fails when\n"
        "it is stale. Do not edit by hand.\n\n"
        "Counted: each SDK's own source files (tests, Rust's inline `#[cfg(test)]` modules, fixtures,\n"
        "build outputs, lock files, package manifests and READMEs left out). *Lines* are all lines;\n"
        "*lines of code* are lines with something besides blanks and comments (docstrings and doc\n"
        "comments are comments). The count is rough: the scan knows comments and one-line strings.\n\n"
        "| language | files | lines | lines of code | wraps |\n"
        "|---|---:|---:|---:|---|\n" + "\n".join(rows) + "\n\n## Per file\n" + "\n".join(details) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write docs/sdk-sizes.md, or check that it is current.")
    p.add_argument(
        "--check", action="store_true", help="exit 1 when docs/sdk-sizes.md differs from what would be written"
    )
    p.add_argument("--output", type=Path, default=DOC, help="the file to write or check (default docs/sdk-sizes.md)")
    args = p.parse_args(argv)
    text = render()
    doc = args.output.absolute()
    shown = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc
    if args.check:
        current = doc.read_text("utf-8") if doc.is_file() else ""
        if current == text:
            print(f"{shown} is current")
            return 0
        diff = "".join(
            difflib.unified_diff(
                current.splitlines(True), text.splitlines(True), f"{shown} (committed)", f"{shown} (from sdk/)"
            )
        )
        print(
            f"{shown} is stale: the SDK sources changed since it was written. Run `python scripts/sdk_sizes.py` "
            f"and commit {shown}.\n{diff}",
            file=sys.stderr,
        )
        return 1
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text, "utf-8")
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
