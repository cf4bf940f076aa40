"""MATLAB's spmd names in a `%%spmd` cell: their NameError gets a line naming nbscale's (`rank` from 0,
`world_size`, `barrier`), since a cell ported from MATLAB reaches for `spmdIndex` first."""

from __future__ import annotations

MATLAB_SPMD_NAMES = frozenset({"spmdIndex", "labindex", "spmdSize", "numlabs", "spmdBarrier"})
_NOTE = "In %%spmd, MATLAB's {name} is {meant}: nbscale's names are rank (counted from 0), world_size and barrier()."
_MEANT = {"spmdIndex": "rank + 1", "labindex": "rank + 1", "spmdSize": "world_size", "numlabs": "world_size"}


def note_matlab_name(error: BaseException) -> None:
    """Add the line naming nbscale's names to a NameError for one of MATLAB's spmd names; others are left as
    they are."""
    if isinstance(error, NameError) and error.name in MATLAB_SPMD_NAMES:
        error.add_note(_NOTE.format(name=error.name, meant=_MEANT.get(error.name, "barrier()")))
