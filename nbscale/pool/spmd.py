"""Running an spmd cell from the notebook: send what it reads, run it everywhere, return Composites."""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nbscale.errors import PoolError
from nbscale.pool import protocol as p
from nbscale.pool.cellvars import names_assigned, names_deleted, names_read
from nbscale.pool.composite import Composite
from nbscale.pool.references import CompositeReference, ModuleReference
from nbscale.pool.transport import serialise

if TYPE_CHECKING:
    from nbscale.pool.pool import Pool

# names every worker defines itself, and IPython's own bookkeeping names
WORKER_NAMES = frozenset({"rank", "world_size", "device", "broadcast", "allreduce", "gather", "allgather", "barrier"})
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___"})
_cell_numbers = itertools.count(1)


def _value_to_send(name: str, value: Any, pool: Pool) -> Any:
    if isinstance(value, Composite):
        if not value.belongs_to(pool):
            raise PoolError(
                f"Variable {name!r} is a Composite of a pool that has stopped or restarted; its values are gone. "
                "Run the cell that makes it again."
            )
        return CompositeReference(value.key)
    if isinstance(value, types.ModuleType):
        return ModuleReference(value.__name__)
    return value


def variables_to_send(code: str, namespace: dict[str, Any], pool: Pool) -> dict[str, Any]:
    """The notebook variables the cell reads before assigning them (modules and Composites by reference)."""
    wanted = names_read(code) - WORKER_NAMES - _IPYTHON_NAMES
    return {
        name: _value_to_send(name, namespace[name], pool)
        for name in sorted(wanted)
        if name in namespace and not (name.startswith("_i") or name.startswith("_o"))
    }


def _name_unpicklable(variables: dict[str, Any]) -> None:
    """Raise a PoolError naming the first variable that cannot be sent."""
    for name, value in variables.items():
        try:
            serialise(value)
        except Exception as error:
            raise PoolError(
                f"Variable {name!r} ({type(value).__name__}) cannot be sent to the workers: {error}. "
                f"Create it inside the %%spmd cell instead, or convert it to something picklable."
            ) from None


def run_spmd_cell(
    pool: Pool, code: str, targets: Iterable[int] | None = None, namespace: dict[str, Any] | None = None
) -> dict[str, Composite]:
    """Run `code` on the workers; every variable it assigns becomes a Composite in `namespace`."""
    namespace = namespace if namespace is not None else {}
    try:
        compile(code, "<spmd cell>", "exec")
    except SyntaxError as error:
        raise PoolError(f"The %%spmd cell has a syntax error on line {error.lineno}: {error.msg}.") from None
    ranks = pool._targets(targets)
    group_ranks = None if ranks == tuple(range(pool.size)) else ranks
    variables = variables_to_send(code, namespace, pool)
    try:
        serialise(variables)
    except Exception:
        _name_unpicklable(variables)
        raise
    if group_ranks is not None:
        pool.ensure_group(group_ranks)
    filename = f"<spmd cell {next(_cell_numbers)}>"
    assigned = names_assigned(code) - WORKER_NAMES
    result_names = tuple(sorted(assigned | names_deleted(code)))
    present = pool.request(
        lambda rid: p.RunCell(rid, code, filename, variables, result_names, group_ranks), ranks, what="The cell"
    )
    composites: dict[str, Composite] = {}
    for name in result_names:
        holders = tuple(rank for rank, names in zip(ranks, present, strict=True) if name in names)
        if holders and name in assigned:
            composites[name] = Composite(pool, name, holders)
        elif not holders and isinstance(namespace.get(name), Composite):
            del namespace[name]  # `del x` on the workers: the notebook's Composite x goes too
    namespace.update(composites)
    return composites
