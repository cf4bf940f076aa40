"""What a %%spmd cell's code sends the notebook (`worker_context().emit(payload)`), handed to the listeners that
packages above the pool add here (a TrainingMonitor's ranks: nbscale.monitor.spmd), so the pool knows none of
them. Listeners run on the pool's receiver thread, in the order added: keep them short; each takes the payloads
it knows and leaves the others."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CellEventListener = Callable[[Any, int, object], None]  # (the pool, nbscale.pool.pool.Pool; rank; payload)

_listeners: list[CellEventListener] = []


def add_cell_event_listener(listener: CellEventListener) -> None:
    """Call `listener(pool, rank, payload)` with every payload a %%spmd cell's code emits (once, however often
    it is added)."""
    if listener not in _listeners:
        _listeners.append(listener)


def cell_events(pool: Any) -> Callable[[int, object], None]:
    """The `on_event` of `pool`'s %%spmd cells: each payload to every listener added."""

    def on_event(rank: int, payload: object) -> None:
        for listener in tuple(_listeners):
            listener(pool, rank, payload)

    return on_event
