"""The package's layers, read from its import graph: the UI sits above the core, and no module imports itself
back through others. Every import counts, also those inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import nbscale

PACKAGE = Path(nbscale.__file__).parent
CORE = ("nbscale.pool", "nbscale.train", "nbscale.data", "nbscale.models", "nbscale.jobs", "nbscale.gpu")
ABOVE_THE_CORE = ("nbscale.ui", "nbscale.notebook", "nbscale.magics")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The nbscale modules `name` imports anywhere in its file (`from package import submodule` counts as the
    submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {target for target in found if target in modules and target != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def test_the_core_never_imports_the_ui_the_notebook_api_or_the_root():
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if _within(name, CORE)
        for target in targets
        if _within(target, ABOVE_THE_CORE) or target == "nbscale"
    )
    assert wrong == []


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    cycles = [sorted(component) for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == []


def test_the_checker_sees_imports_inside_functions_and_type_checking_blocks(tmp_path):
    """The walk above must not miss the imports that hid the old cycles."""
    source = tmp_path / "sample.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nbscale.ui import table\n"
                      "def f():\n    import nbscale.notebook\n    from nbscale.ui.table import text_table\n")
    modules = {"nbscale.ui": PACKAGE / "ui", "nbscale.ui.table": PACKAGE / "ui" / "table.py",
               "nbscale.notebook": PACKAGE / "notebook.py", "nbscale.sample": source}
    assert _imports("nbscale.sample", source, modules) == {"nbscale.ui.table", "nbscale.notebook"}


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm: the groups of modules that import each other (directly or through others)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components
