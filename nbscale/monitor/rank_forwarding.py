"""A TrainingMonitor in a %%spmd cell, a rank's side: its events forwarded to the notebook in bunches
(nbscale.training.event_bunches, as the distributed path sends training events) by rank 0 (every rank with
reduce="mean"); the notebook's Stop stops it and the cell's end closes it. spmd.py shows them in the notebook."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from nbscale.monitor.producer import Producer
from nbscale.training.event_bunches import EventBunches

_created_on_this_worker = [0]  # the n-th monitor of a worker: the same on every rank, which run the same cell


@dataclass(frozen=True)
class RankEvents:
    """What a %%spmd rank's monitor sends the notebook: its layout, then a bunch of its events in order."""

    key: int
    panels: list[tuple[str, list[str]]]
    x_label: str
    metrics: tuple[str, ...]
    reduce: str
    world_size: int
    events: list[Any]


def forward_from_rank(monitor: Producer, attached: contextlib.ExitStack) -> None:
    """On a %%spmd rank: the notebook's Stop stops `monitor`, the cell's end closes it, and rank 0 (every rank
    with reduce="mean") forwards its events to the notebook's view."""
    from nbscale.pool.context import worker_context

    _created_on_this_worker[0] += 1
    key = _created_on_this_worker[0]
    context = worker_context()
    context.at_cell_end.append(monitor.close)

    def on_stop() -> None:
        monitor.request_stop("Stopped from the notebook")

    context.on_stop.append(on_stop)
    attached.callback(_removed, context.on_stop, on_stop)
    if context.stop_requested:  # asked before this monitor was made
        on_stop()
    if context.rank != 0 and monitor.reduce != "mean":
        return
    layout = (monitor.panels, monitor.x_label, monitor.metrics, monitor.reduce, context.world_size)
    bunches = EventBunches(lambda events: context.emit(RankEvents(key, *layout, events)))
    monitor.events.subscribe(bunches.send)
    attached.callback(bunches.flush)  # after MonitorDone: the last bunch goes at once


def _removed(callbacks: list[Any], callback: Any) -> None:
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)
