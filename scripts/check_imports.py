"""The import rules of the house, checked over the code's own imports (CI runs it; so does the fast tier).

- no circle among the modules of runtime/, launcher/, manifests/ and toolchains/;
- the node's packages (runtime/ but runtime/meshctl/) never import the operator's side, runtime.meshctl;
- launcher/ imports nothing of NATS and nothing of runtime/; manifests/ nothing of the others;
- runtime/wire/ (what is on the bus) imports no other runtime package;
- an import inside a function (a verb loading what it uses when it runs) only in runtime/meshctl/verbs/,
  runtime/meshctl/face/main.py and where a line says `# lazy:` why.

Usage: python scripts/check_imports.py [ROOT]; prints every breach and exits 1, or one line and 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("runtime", "launcher", "manifests", "toolchains")
LAZY_ALLOWED = ("runtime/meshctl/verbs/", "runtime/meshctl/face/main.py")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(root: Path, path: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """Every first-party or NATS module `path` imports, and its function-local imports (line, name)."""
    tree = ast.parse(path.read_text(), str(path))
    this = module_name(root, path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    lazy: list[tuple[int, str]] = []
    lines = path.read_text().splitlines()

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                continue  # annotations only: never imported at run time
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")
                    up = up[: len(up) - (child.level - 1)] if child.level > 1 else up
                    base = ".".join(up + ([child.module] if child.module else []))
                names = [base] + [f"{base}.{a.name}" for a in child.names]
            for name in names:
                if name.split(".")[0] in (*PACKAGES, "nats"):
                    found.add(name)
            ours = [n for n in names if n.split(".")[0] in (*PACKAGES, "nats")]
            line = getattr(child, "lineno", 0)
            if ours and in_function and "# lazy:" not in lines[line - 1]:
                lazy.append((line, ours[0]))
            visit(child, inner, type_checking)

    visit(tree, False, False)
    return found, lazy


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def check(root: Path) -> list[str]:
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    modules = {module_name(root, p): p for p in files}
    graph: dict[str, set[str]] = {}
    breaches: list[str] = []
    for name, path in modules.items():
        found, lazy = imports_of(root, path)
        rel = str(path.relative_to(root))
        # An import of `a.b.c` names module a.b.c when it is one, else the module a.b it comes from.
        targets = {t if t in modules else t.rpartition(".")[0] for t in found}
        graph[name] = {t for t in targets if t in modules and t != name}
        for target in sorted(found):
            top = target.split(".")[0]
            if name.startswith("launcher") and (top in ("nats", "runtime", "toolchains")):
                breaches.append(f"{rel}: imports {target}; the launcher knows nothing of NATS or the node")
            if name.startswith("manifests") and top in ("nats", "runtime", "launcher", "toolchains"):
                breaches.append(f"{rel}: imports {target}; manifests knows nothing of processes or the bus")
            if (
                name.startswith("runtime")
                and not name.startswith("runtime.meshctl")
                and target.startswith("runtime.meshctl")
            ):
                breaches.append(f"{rel}: imports {target}; the node's packages never import the operator's side")
            if (
                name.startswith("runtime.wire")
                and target.startswith("runtime.")
                and not target.startswith("runtime.wire")
            ):
                breaches.append(f"{rel}: imports {target}; runtime/wire/ imports no other runtime package")
        if not rel.startswith(LAZY_ALLOWED):
            for line, target in lazy:
                breaches.append(
                    f"{rel}:{line}: imports {target} inside a function; import at the top, or say why with `# lazy:`"
                )
    breaches += [f"circle: {' -> '.join(c)}" for c in _circles(graph)]
    return breaches


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), as a path that closes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group) + [sorted(group)[0]])

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    breaches = check(root)
    for b in breaches:
        print(b)
    if breaches:
        return 1
    print(f"imports: ok ({sum(1 for p in PACKAGES for _ in (root / p).rglob('*.py'))} modules, no circle)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
