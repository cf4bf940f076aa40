"""The style rules ruff does not check (docs/development.md): no function in nbscale/ longer than a screen."""

from __future__ import annotations

import ast
from pathlib import Path

import nbscale

PACKAGE = Path(nbscale.__file__).parent
MAX_FUNCTION_LINES = 60


def _long_functions(source: str, filename: str) -> list[str]:
    """'file:line name (N lines)' for each function or method over MAX_FUNCTION_LINES, from its `def` to its last
    line (decorators left out; a nested function counts inside its parent and on its own)."""
    return [
        f"{filename}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_in_nbscale_is_over_60_lines():
    long = [
        found
        for path in sorted(PACKAGE.rglob("*.py"))
        for found in _long_functions(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert long == [], "split these into functions of at most 60 lines: " + "; ".join(long)


def test_a_function_of_61_lines_is_found_and_one_of_60_is_not():
    def function(name: str, lines: int) -> str:
        return f"@decorated\ndef {name}():\n" + "    x = 1\n" * (lines - 1)

    source = (
        function("fits", 60)
        + "class Holder:\n"
        + "\n".join("    " + line for line in function("too_long", 61).splitlines())
        + "\n"
    )
    assert _long_functions(source, "sample.py") == [
        "sample.py:64 too_long (61 lines)"
    ]  # fits and its decorator fill 61 lines
