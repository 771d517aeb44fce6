"""quantlab.numerics imports nothing from the rest of quantlab, and its modules import each
other without cycles (every import statement counts: top level, inside functions and under
TYPE_CHECKING)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "quantlab.numerics"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports: ``import a.b`` -> a.b; ``from a import b`` -> a.b when
    that is a module, else a (relative imports resolved)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(sub) else base)
    return found


def _graph() -> dict[str, set[str]]:
    files = sorted((ROOT / "quantlab" / "numerics").rglob("*.py"))
    assert len(files) > 20
    return {_module_name(f): _imports(f) for f in files}


def test_numerics_imports_nothing_from_the_rest_of_quantlab():
    bad = [
        f"{mod} imports {imp}"
        for mod, imps in _graph().items()
        for imp in sorted(imps)
        if (imp == "quantlab" or imp.startswith("quantlab."))
        and not (imp == PACKAGE or imp.startswith(PACKAGE + "."))
    ]
    assert not bad, "\n".join(bad)


def test_numerics_modules_import_each_other_without_cycles():
    graph = {m: {i for i in imps if i.startswith(PACKAGE)} for m, imps in _graph().items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append(" -> ".join(path[path.index(n) :] + [n]))
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)
