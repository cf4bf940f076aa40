"""The points a TrainingMonitor's figure draws, kept by a listener on the monitor's events (in the notebook, or
read back from a %%batch job's record): per metric its values, their smoothed line and the step of each (each
metric its own steps: one recorded once an epoch has few). Thinned past HISTORY_ROWS points as the monitor's
history is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nbscale.training.events import MetricsRead
from nbscale.ui.progress_figure import extend_smoothed

HISTORY_ROWS = 100_000  # the most steps a monitor's history keeps: past that, every second one goes (thin_history)


class FigureColumns:
    """Listener: each read's values added to `columns` ("loss", "loss_smooth", "loss_iteration", ...), thinned
    past HISTORY_ROWS points a metric as the monitor's history is (thin_history)."""

    def __init__(self, metrics: Sequence[str]) -> None:
        self.columns: dict[str, list[float]] = {}
        for name in metrics:
            self.columns.update({name: [], f"{name}_smooth": [], f"{name}_iteration": []})

    def __call__(self, event: object) -> None:
        if isinstance(event, MetricsRead) and event.steps:
            self.add(event)

    def add(self, read: MetricsRead) -> None:
        c, steps = self.columns, read.steps
        for name, (rows, values) in read.columns.items():
            if rows == list(range(len(steps))):  # one value at every step (the common case): in one go
                c[f"{name}_iteration"].extend(steps)
            else:
                c[f"{name}_iteration"].extend([steps[row] for row in rows])
            c[name].extend(values)
            extend_smoothed(c[f"{name}_smooth"], values)
        if any(len(column) > HISTORY_ROWS for column in c.values()):
            thin_history(c)  # the figure's points, each metric's own


def thin_history(columns: Mapping[str, list[Any]], limit: int = HISTORY_ROWS) -> None:
    """Halve each list of `columns` longer than `limit` until it fits, in place: every second entry goes, the last
    one stays (a step recorded on both sides of a read joins it). A long run's history then spans the whole run,
    its older steps coarser, in bounded memory (about 230 bytes a step kept) instead of growing with every step."""
    for values in columns.values():
        while len(values) > limit:
            values[:] = values[(len(values) - 1) % 2 :: 2]
