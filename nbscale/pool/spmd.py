"""An spmd cell as the notebook sends it: what it reads (sent along), what it assigns (its Composites).

`Pool.spmd` runs it: `SpmdCell.prepare` checks the code and gathers the notebook variables it reads,
`message` is what every worker runs, and `bind_results` turns the names each worker now holds into Composites
(what its code emits goes to the listeners of cell_events.py).
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nbscale.cellvars import IPYTHON_NAMES, names_assigned, names_deleted, names_read
from nbscale.errors import PoolError
from nbscale.pool import protocol as p
from nbscale.pool.composite import Composite, CompositeSource
from nbscale.pool.folders import current_folder
from nbscale.pool.references import CompositeReference, ModuleReference
from nbscale.pool.transport import serialise
from nbscale.pool.unsendable import interrupted_while_pickling, variable_error

# names every worker defines itself
WORKER_NAMES = frozenset({"rank", "world_size", "device", "broadcast", "allreduce", "gather", "allgather", "barrier"})
_cell_numbers = itertools.count(1)
_UNSENDABLE_FIX = "Create it inside the %%spmd cell instead, or convert it to something picklable."


@dataclass(frozen=True)
class SpmdCell:
    """One cell ready to send: its code, the variables it reads, and the names it assigns or deletes."""

    code: str
    filename: str  # "<spmd cell N>" or the caller's: tracebacks show the cell's own line numbers
    variables: dict[str, Any]
    assigned: frozenset[str]
    result_names: tuple[str, ...]

    @classmethod
    def prepare(
        cls, code: str, namespace: dict[str, Any], pool: CompositeSource, filename: str | None = None
    ) -> SpmdCell:
        """Check the code and gather what it reads from `namespace`; PoolError for a syntax error, a Composite of
        another pool, or a variable that cannot be sent (UnsendableError naming it). `filename` names the code in
        tracebacks (default `<spmd cell N>`)."""
        try:
            compile(code, "<spmd cell>", "exec")
        except SyntaxError as error:
            magic = (error.text or "").lstrip().startswith(("%", "!"))
            hint = (
                " The workers run the cell as plain Python: IPython's %magics and !commands do not run there."
                if magic
                else ""
            )
            raise PoolError(f"The %%spmd cell has a syntax error on line {error.lineno}: {error.msg}.{hint}") from None
        variables = variables_to_send(code, namespace, pool)
        try:
            serialise(variables)
        except KeyboardInterrupt:
            raise interrupted_while_pickling() from None
        except Exception as error:
            raise variable_error(variables, error, _UNSENDABLE_FIX) from None
        assigned = frozenset(names_assigned(code) - WORKER_NAMES)
        return cls(
            code,
            filename or f"<spmd cell {next(_cell_numbers)}>",
            variables,
            assigned,
            tuple(sorted(assigned | names_deleted(code))),
        )

    def message(self, request_id: int, group_ranks: tuple[int, ...] | None) -> p.RunCell:
        """The request every worker runs: in the notebook's current folder (as MATLAB's spmd does)."""
        return p.RunCell(
            request_id, self.code, self.filename, self.variables, self.result_names, group_ranks, current_folder()
        )

    def bind_results(
        self, pool: CompositeSource, ranks: Sequence[int], present: Sequence[list[str]], namespace: dict[str, Any]
    ) -> dict[str, Composite]:
        """Bind a Composite in `namespace` for each name the cell assigned (`present`: each rank's names);
        a name the cell deleted on every worker that holds it removes its Composite from the notebook too.
        Workers the cell did not run on (--targets) keep their values of an earlier Composite of that name."""
        composites: dict[str, Composite] = {}
        for name in self.result_names:
            holders = {rank for rank, names in zip(ranks, present, strict=True) if name in names}
            previous = namespace.get(name)
            kept: set[int] = set()
            if isinstance(previous, Composite) and previous.key == name and previous.belongs_to(pool):
                kept = set(previous.ranks) - set(ranks)
            if (holders and name in self.assigned) or kept:
                composites[name] = Composite(pool, name, tuple(sorted(holders | kept)))
            elif not holders and isinstance(previous, Composite):
                del namespace[name]  # `del x` on the workers: the notebook's Composite x goes too
        namespace.update(composites)
        return composites


def variables_to_send(code: str, namespace: dict[str, Any], pool: CompositeSource) -> dict[str, Any]:
    """The notebook variables the cell reads before assigning them (modules and Composites by reference)."""
    wanted = names_read(code) - WORKER_NAMES - IPYTHON_NAMES
    return {
        name: _value_to_send(name, namespace[name], pool)
        for name in sorted(wanted)
        if name in namespace and not (name.startswith("_i") or name.startswith("_o"))
    }


def _value_to_send(name: str, value: object, pool: CompositeSource) -> object:
    if isinstance(value, types.ModuleType):
        return ModuleReference(value.__name__)
    return each_workers_own(value, pool, f"Variable {name!r}")


def each_workers_own(value: object, pool: CompositeSource, described: str) -> Any:
    """A Composite of `pool` as a reference each worker resolves to its own value; any other value unchanged.

    Raises PoolError for a Composite whose values are gone (its pool stopped or restarted)."""
    if not isinstance(value, Composite):
        return value
    if not value.belongs_to(pool):
        raise PoolError(
            f"{described} is a Composite of a pool that has stopped or restarted; its values are gone. "
            "Run the cell that makes it again."
        )
    return CompositeReference(value.key)
