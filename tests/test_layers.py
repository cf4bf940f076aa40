"""The package's layers, read from its import graph: each package imports only the packages below it (the table
below), and no module imports itself back through others. Every import counts, also those inside functions and
under TYPE_CHECKING. docs/architecture.md ("Packages and modules") draws the same graph."""

from __future__ import annotations

import ast
from pathlib import Path

import nbscale

PACKAGE = Path(nbscale.__file__).parent

# Modules every part may import: they import none of the parts below (nor each other, today).
SHARED = {
    "errors",
    "user_warnings",
    "outputs",
    "rendering",
    "safe_load",
    "trust",
    "logger_files",
    "processes",
    "cellvars",
    "suggestions",
    "notices",
    "file_locks",
    "version",
    "lab_extension",
    "cpus",
    "ports",
    "progress_bar",
    "cell_names",
}
# What a pool runs on: GPUs on this machine, cluster profiles and SLURM's commands.
MACHINE = {"gpu_reservations", "gpu", "cluster_profiles", "slurm_profile", "slurm_commands"}
# The core: no widget, no notebook display, no magic, no server.
CORE = {*MACHINE, "pool", "models", "data", "training", "jobs", "confusion", "inference", "loggers"}

# Each part of nbscale (a package, or a module at its top) and the parts it may import besides itself and SHARED.
# A new part must be placed here: the table, not the code, says which way imports go.
MAY_IMPORT: dict[str, set[str]] = {
    **{name: set() for name in SHARED},
    "gpu_reservations": set(),
    "gpu": {"gpu_reservations"},
    "cluster_profiles": {"slurm_profile"},
    "slurm_profile": set(),
    "slurm_commands": {"slurm_profile"},
    "pool": {*MACHINE},  # generic: nothing of data, training or jobs
    "models": set(),
    "data": {"pool"},  # a pool's ranks exchange the data they read (sealed pickles); never train/ or jobs/
    "training": {*MACHINE, "pool", "models", "data"},  # never jobs/: jobs add their recorder as a run observer
    "jobs": {*MACHINE, "pool", "models", "data", "training"},
    "confusion": set(),
    "inference": {*MACHINE, "pool", "models", "data", "training", "confusion"},
    "loggers": {"training"},
    "ui": {*CORE},
    "notebook": {*CORE, "ui"},
    "monitor": {*CORE, "ui", "notebook"},
    "magics": {*CORE, "ui", "notebook", "monitor"},
    "server": {*CORE},  # JSON for the lab extension: no widgets
    "doctor": {*CORE},
    "cli": {*CORE, "ui", "doctor"},
    "__main__": {"cli"},
    "nbscale": {*CORE, "ui", "notebook", "monitor", "magics"},  # the root: the public names
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _import_lines(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The nbscale modules `name` imports anywhere in its file, each with the line of its first import
    (`from package import submodule` counts as the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in modules else base)
        for target in targets:
            if target in modules and target != name:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    return set(_import_lines(name, path, modules))


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _part(module: str) -> str:
    """The part of nbscale a module belongs to: `nbscale.training.loop` -> "training", the root -> "nbscale"."""
    return module.split(".")[1] if "." in module else module


def _wrong_imports(modules: dict[str, Path], root: Path = PACKAGE.parent) -> list[str]:
    """Every import the table does not allow, as `file:line: module imports target (part may import ...)`, the
    file relative to `root`."""
    wrong = []
    for name, path in sorted(modules.items()):
        part = _part(name)
        allowed = {part, *SHARED, *MAY_IMPORT.get(part, set())}
        for target, line in sorted(_import_lines(name, path, modules).items()):
            if _part(target) not in allowed:
                shown = ", ".join(sorted(MAY_IMPORT.get(part, set()))) or "only the shared modules"
                wrong.append(f"{path.relative_to(root)}:{line}: {name} imports {target} ({part} may import: {shown})")
    return wrong


def test_every_part_of_nbscale_has_its_place_in_the_package_table():
    parts = {_part(name) for name in _modules()}
    assert sorted(parts - set(MAY_IMPORT)) == [], "place each new package or module in MAY_IMPORT"
    assert sorted(set(MAY_IMPORT) - parts) == [], "a part in MAY_IMPORT that nbscale no longer has"


def test_each_package_imports_only_the_packages_the_table_allows():
    assert _wrong_imports(_modules()) == []


def test_the_package_table_points_one_way():
    """No two parts may import each other, directly or through others: the table is a layering."""
    cycles = [sorted(group) for group in _strongly_connected(MAY_IMPORT) if len(group) > 1]
    assert cycles == []
    assert all(not MAY_IMPORT[name] for name in SHARED)


def test_the_core_may_not_import_the_ui_the_notebook_api_the_magics_the_server_or_the_root():
    above = {"ui", "notebook", "monitor", "magics", "server", "cli", "doctor", "nbscale"}
    assert {part: sorted(MAY_IMPORT[part] & above) for part in CORE} == {part: [] for part in CORE}


def test_a_wrong_import_is_reported_with_its_file_and_line(tmp_path):
    source = tmp_path / "nbscale" / "data" / "sample.py"
    source.parent.mkdir(parents=True)
    source.write_text("import torch\n\ndef f():\n    from nbscale.training import loop\n")
    (tmp_path / "nbscale" / "training").mkdir()
    (tmp_path / "nbscale" / "training" / "loop.py").write_text("")
    modules = {"nbscale.data.sample": source, "nbscale.training.loop": tmp_path / "nbscale" / "training" / "loop.py"}
    assert _wrong_imports(modules, tmp_path) == [
        "nbscale/data/sample.py:4: nbscale.data.sample imports nbscale.training.loop (data may import: pool)"
    ]


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    cycles = [sorted(component) for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == []


def test_the_checker_sees_imports_inside_functions_and_type_checking_blocks(tmp_path):
    """The walk above must not miss the imports that hid the old cycles."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nbscale.ui import table\n"
        "def f():\n    import nbscale.notebook\n    from nbscale.ui.table import text_table\n"
    )
    modules = {
        "nbscale.ui": PACKAGE / "ui",
        "nbscale.ui.table": PACKAGE / "ui" / "table.py",
        "nbscale.notebook": PACKAGE / "notebook.py",
        "nbscale.sample": source,
    }
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
