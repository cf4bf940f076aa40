"""Which notebook variables a cell reads, and which it assigns: the basis of automatic transfer.

`names_read` walks the cell in execution order and keeps every name loaded before the cell binds it itself
(at top level, or as a global read inside functions the cell defines), builtin names included: callers keep
the names their namespace defines. `names_assigned` lists the variables
the cell binds at top level by assignment (not imports, functions or classes) or through `global` in a function it
defines, the ones that become results.
"""

from __future__ import annotations

import ast
import builtins

# IPython's own names in every notebook namespace (its wrapper of the builtin open included): never sent
IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open", "_", "__", "___"})
# the module's own names (__name__, __doc__, ...) are each namespace's, never the notebook's to send
_MODULE_DUNDERS = frozenset(name for name in dir(builtins) if name.startswith("__"))


class _ReadBeforeAssign(ast.NodeVisitor):
    """Collect top-level names read before the cell assigns them."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.read: set[str] = set()
        self.function_depth = 0
        self.local_scopes: list[set[str]] = []

    # statements whose value runs before their targets bind
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._load(node.target.id)
        self.visit(node.value)
        self.visit(node.target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.visit(node.target)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            self._bind((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(default)
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
            self._bind(node.name)
        arguments = node.args
        parameters = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
        parameters |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
        scope = parameters | _locally_bound(node)
        self.local_scopes.append(scope)
        self.function_depth += 1
        body = node.body if isinstance(node.body, list) else [node.body]
        for statement in body:
            self.visit(statement)
        self.function_depth -= 1
        self.local_scopes.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expression in node.bases + node.decorator_list + [k.value for k in node.keywords]:
            self.visit(expression)
        self._bind(node.name)
        for statement in node.body:
            self.visit(statement)

    def _visit_comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> None:
        generators = node.generators
        scope = {n.id for g in generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        self.visit(generators[0].iter)
        self.local_scopes.append(scope)
        for generator in generators:
            if generator is not generators[0]:
                self.visit(generator.iter)
            for condition in generator.ifs:
                self.visit(condition)
        for field in ("elt", "key", "value"):
            if hasattr(node, field):
                self.visit(getattr(node, field))
        self.local_scopes.pop()

    visit_ListComp = _visit_comprehension
    visit_SetComp = _visit_comprehension
    visit_DictComp = _visit_comprehension
    visit_GeneratorExp = _visit_comprehension

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._load(node.id)
        elif self.function_depth == 0:
            self._bind(node.id)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name and self.function_depth == 0:
            self._bind(node.name)
        for statement in node.body:
            self.visit(statement)

    def _load(self, name: str) -> None:
        if any(name in scope for scope in self.local_scopes):
            return
        # builtins too: a notebook variable named `input` or `sum` hides the builtin
        if name not in self.bound and name not in _MODULE_DUNDERS:
            self.read.add(name)

    def _bind(self, name: str) -> None:
        if self.function_depth == 0 and not self.local_scopes:
            self.bound.add(name)


def _locally_bound(function: ast.AST) -> set[str]:
    """Names a function body assigns (its locals), not counting nested functions' bodies."""
    names: set[str] = set()
    declared_global: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Global):
            declared_global.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names - declared_global


def names_read(code: str) -> set[str]:
    """Names the cell reads before binding them itself (candidates to send from the notebook)."""
    visitor = _ReadBeforeAssign()
    visitor.visit(ast.parse(code))
    return visitor.read


def names_assigned(code: str) -> set[str]:
    """Variables the cell assigns at top level (assignment, augmented/annotated assignment, for, with, walrus)."""
    assigned: set[str] = set()
    for statement in _top_level_statements(ast.parse(code).body):
        targets: list[ast.AST] = []
        if isinstance(statement, ast.Assign):
            targets = list(statement.targets)
        elif isinstance(statement, ast.AugAssign | ast.AnnAssign):
            targets = [statement.target]
        elif isinstance(statement, ast.For | ast.AsyncFor):
            targets = [statement.target]
        elif isinstance(statement, ast.With | ast.AsyncWith):
            targets = [item.optional_vars for item in statement.items if item.optional_vars is not None]
        for target in targets:
            assigned.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        for node in ast.walk(statement) if not isinstance(statement, ast.FunctionDef | ast.ClassDef) else []:
            if isinstance(node, ast.NamedExpr):
                assigned.add(node.target.id)
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            # `global x` and `x = ...` in a function the cell defines: calling it assigns the cell's variable x
            declared = {name for node in ast.walk(statement) if isinstance(node, ast.Global) for name in node.names}
            assigned.update(
                node.id
                for node in ast.walk(statement)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in declared
            )
    return {name for name in assigned if not name.startswith("_")}


def names_bound(code: str) -> set[str]:
    """Names the cell binds at top level: its assignments (names_assigned) and its def, class and import names."""
    bound = names_assigned(code)
    for statement in _top_level_statements(ast.parse(code).body):
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(statement.name)
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
    return bound


def names_deleted(code: str) -> set[str]:
    """Variables the cell deletes at top level (`del x`): their Composites leave the notebook with them."""
    deleted: set[str] = set()
    for statement in _top_level_statements(ast.parse(code).body):
        if isinstance(statement, ast.Delete):
            deleted.update(target.id for target in statement.targets if isinstance(target, ast.Name))
    return deleted


def _top_level_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements that run at the cell's top level, including those nested in if/for/while/with/try."""
    statements: list[ast.stmt] = []
    for statement in body:
        statements.append(statement)
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            statements.extend(_top_level_statements(getattr(statement, field, []) or []))
        for handler in getattr(statement, "handlers", []) or []:
            statements.extend(_top_level_statements(handler.body))
    return statements
