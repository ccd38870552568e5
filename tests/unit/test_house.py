"""The house's rules, pinned: the import rules (scripts/check_imports.py) on this checkout and on a
small tree that breaks each of them; runtime/ holds at most 8 files directly; no file of the node's
code over 450 lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450


def _checker() -> Any:
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_imports"] = module
    spec.loader.exec_module(module)
    return module


def test_this_checkout_keeps_the_import_rules() -> None:
    assert _checker().check(ROOT) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for pkg in ("runtime", "launcher", "manifests", "toolchains"):
        (root / pkg).mkdir(exist_ok=True)
    return root


@pytest.mark.parametrize(
    "files, said",
    [
        ({"launcher/a.py": "import nats\n"}, "the launcher knows nothing of NATS"),
        ({"launcher/a.py": "from runtime.config import X\n"}, "the launcher knows nothing of NATS"),
        ({"runtime/node/a.py": "from runtime.meshctl.cli import main\n"}, "never import the operator's side"),
        ({"runtime/wire/a.py": "from runtime.calls.routes import Route\n"}, "imports no other runtime package"),
        ({"manifests/a.py": "import launcher.process\n"}, "manifests knows nothing"),
        ({"runtime/calls/a.py": "def f():\n    from runtime.wire import b\n"}, "inside a function"),
        ({"runtime/a.py": "from runtime import b\n", "runtime/b.py": "from runtime import a\n"}, "circle: runtime.a"),
    ],
)
def test_each_rule_is_caught(tmp_path: Path, files: dict[str, str], said: str) -> None:
    breaches = _checker().check(_tree(tmp_path, files))
    assert any(said in b for b in breaches), breaches


def test_a_lazy_import_is_allowed_where_a_verb_loads_what_it_uses(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "runtime/meshctl/verbs/node.py": "def run():\n    from runtime.node import node\n",
            "runtime/calls/x.py": "def f():\n    from runtime.wire import y  # lazy: a test says why\n",
        },
    )
    assert _checker().check(root) == []


def test_runtime_holds_few_files_and_none_is_long() -> None:
    top = [p.name for p in (ROOT / "runtime").iterdir() if p.is_file() and p.suffix == ".py"]
    assert len(top) <= 8, top
    long = {
        str(p.relative_to(ROOT)): n
        for pkg in ("runtime", "launcher", "manifests", "toolchains")
        for p in (ROOT / pkg).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines: {long}"
