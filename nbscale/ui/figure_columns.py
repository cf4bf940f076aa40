"""The points a TrainingMonitor's figure draws, kept by a listener on the monitor's events: per metric its values,
their smoothed line and the step of each (each metric its own steps: one recorded once an epoch has few)."""

from __future__ import annotations

from collections.abc import Sequence

from nbscale.monitor.records import HISTORY_ROWS, thin_history
from nbscale.training.events import MetricsRead
from nbscale.ui.progress_figure import extend_smoothed


class FigureColumns:
    """Listener: each read's values added to `columns` ("loss", "loss_smooth", "loss_iteration", ...), thinned
    past HISTORY_ROWS points a metric as the monitor's history is (records.thin_history)."""

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
