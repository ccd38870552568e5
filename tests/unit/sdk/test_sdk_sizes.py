"""docs/sdk-sizes.md is the record of each SDK's size (record 0188): it must match the SDKs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "sdk_sizes.py"


def _script():
    """scripts/ is not a package: load the script as a module (once; dataclasses need it registered)."""
    if "sdk_sizes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("sdk_sizes", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["sdk_sizes"] = module
        spec.loader.exec_module(module)
    return sys.modules["sdk_sizes"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_committed_sdk_sizes_are_current() -> None:
    done = run("--check")
    assert done.returncode == 0, done.stderr


def test_a_stale_record_is_refused_with_the_command_that_fixes_it(tmp_path: Path) -> None:
    stale = tmp_path / "sdk-sizes.md"
    stale.write_text((REPO / "docs" / "sdk-sizes.md").read_text().replace("| python |", "| python (old) |"))
    done = run("--check", "--output", str(stale))
    assert done.returncode == 1
    assert "is stale" in done.stderr and "python scripts/sdk_sizes.py" in done.stderr
    assert "python (old)" in done.stderr  # the diff shows what changed


def test_python_lines_of_code_leave_out_comments_docstrings_and_blanks() -> None:
    text = '"""Module doc."""\n\n# comment\ndef f(x):\n    """Doc\n    more."""\n    return """not\n    a doc"""  # trailing\n'
    assert _script().python_code_lines(text) == 3  # def, and the two lines of the returned string


def test_c_family_lines_of_code_know_comments_and_strings() -> None:
    count = _script().c_family_code_lines
    text = '/* block\n * more */\nint x; // note\n// only a comment\nchar *u = "http://a"; /* c */\n\nint y; /* open\nstill */ int z;\n'
    assert count(text, "c") == 4
    # A Rust lifetime is not the start of a char literal that would swallow the comment.
    assert count("fn f<'a>(x: &'a str) {} // c\n// only\n", "rust") == 1


def test_rust_inline_test_modules_are_left_out() -> None:
    text = "pub fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n"
    assert _script().without_rust_tests(text) == "pub fn a() {}\n\n"


def test_tests_and_build_outputs_are_not_counted() -> None:
    files = {
        str(p.relative_to(REPO))
        for lang in ("go", "typescript", "python")
        for p in _script().source_files(REPO / "sdk" / lang, lang)
    }
    assert not any(f.endswith("_test.go") or "/node_modules/" in f or "/dist/" in f or "/test/" in f for f in files)
    assert "sdk/go/meshsdk.go" in files
