"""A TrainingMonitor in a %%spmd cell, the notebook's side: the ranks' forwarded events (rank_forwarding.py)
shown as one monitor (`NotebookView`), whose Stop reaches every rank.

The notebook hears the ranks through the pool's cell-event listeners (nbscale.pool.cell_events): this module adds
its listener when imported, which the package's __init__ does, and so unpickling a rank's first `RankEvents` at the
latest.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nbscale.monitor.rank_forwarding import RankEvents
from nbscale.monitor.training_monitor import TrainingMonitor
from nbscale.pool.cell_events import add_cell_event_listener
from nbscale.training.events import MetricsRead, MonitorDone, PanelScale

if TYPE_CHECKING:
    from nbscale.pool.pool import Pool


class NotebookView(TrainingMonitor):
    """The notebook's monitor for a %%spmd cell's ranks: rank 0's rows, or with reduce="mean" each step's mean
    once every rank sent it; its Stop asks every rank to stop (pool.request_stop)."""

    interrupt_stops = False  # the pool's own interrupt handling stops the ranks

    def __init__(self, first: RankEvents, pool: Pool) -> None:
        groups = {title: members for title, members in first.panels if [title] != members}
        super().__init__(first.metrics, x_label=first.x_label, groups=groups)
        self.world_size = first.world_size
        self.waiting: dict[tuple[Any, str], list[float]] = {}
        self.done_ranks: set[int] = set()
        self._stop.on_request.append(pool.request_stop)
        self.info_names = ()

    @property
    def closed(self) -> bool:
        return self._closed

    def _read_due(self) -> None:
        """Nothing in the middle of a rank's message: `add` reads and publishes once all its rows are kept."""

    def add(self, forwarded: RankEvents, rank: int) -> None:
        """A rank's bunch of events: its reads recorded here (rank 0's info, progress and status shown), its
        panels' scales set, and the view closed once every rank that forwards is done."""
        rows = 0
        for event in forwarded.events:
            if isinstance(event, MetricsRead):
                rows += len(event.steps)
                self._add_read(event, rank, forwarded.reduce)
            elif isinstance(event, PanelScale):
                self.events.publish(event)
            elif isinstance(event, MonitorDone):
                self.done_ranks.add(rank)
        if self.done_ranks and (forwarded.reduce != "mean" or len(self.done_ranks) == self.world_size):
            self.close()
        else:
            self._flush(time.perf_counter(), flushed=not rows)

    def _add_read(self, read: MetricsRead, rank: int, reduce: str) -> None:
        if rank == 0:
            self.info, self.progress, self.status = read.info, read.progress, read.status
        for step, values in read.rows():
            if reduce == "mean":
                values = self._means(step, values)
            if values:
                self.record(step, **values)

    def _means(self, step: object, values: dict[str, float]) -> dict[str, float]:
        means = {}
        for name, value in values.items():
            seen = self.waiting.setdefault((step, name), [])
            seen.append(value)
            if len(seen) == self.world_size:
                means[name] = sum(seen) / len(seen)
                del self.waiting[(step, name)]
        return means


views: dict[int, NotebookView] = {}


def show_in_notebook(pool: Pool, rank: int, payload: object) -> None:
    """The pool's cell-event listener: a rank's RankEvents shown by the cell's one view (made at the first)."""
    if not isinstance(payload, RankEvents):
        return
    view = views.get(payload.key)
    if view is None or view.closed:
        view = views[payload.key] = NotebookView(payload, pool)
    view.add(payload, rank)


add_cell_event_listener(show_in_notebook)
