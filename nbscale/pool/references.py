"""Stand-ins sent instead of values: a worker resolves them to its own copy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompositeReference:
    """'Use your own value of the variable `key`' (a Composite used in a later spmd cell: no transfer)."""

    key: str


@dataclass(frozen=True)
class ModuleReference:
    """'Import `module`' (a module the notebook imported, read by a cell)."""

    module: str
