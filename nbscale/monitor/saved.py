"""A TrainingMonitor as pickled (a `%%batch` job saves the variables its cell assigned): what it recorded, its
info and status, restored as a closed monitor that shows nowhere. Its display, Stop button and loggers belong to
the process that ran the loop, and are not saved. Registered with copyreg (pickle's and cloudpickle's reducers)
when nbscale.monitor is imported."""

from __future__ import annotations

import copyreg
from typing import TYPE_CHECKING, Any

from nbscale.monitor.listeners import Listeners
from nbscale.monitor.training_monitor import TrainingMonitor
from nbscale.ui.figure_columns import FigureColumns

if TYPE_CHECKING:
    from collections.abc import Mapping


class SavedMonitor(TrainingMonitor):
    """A TrainingMonitor read back from a pickle: `history`, `to_dataframe()`, `info`, `status` and `stop_reason`
    as they were when it was saved; it draws nowhere and records no more (it is closed)."""

    def _attach_listeners(self) -> Listeners:
        return Listeners(FigureColumns(self.metrics))  # nothing listens: it shows nowhere


def saved_state(monitor: TrainingMonitor) -> tuple[Any, ...]:
    """`monitor.__reduce__`: what it recorded so far (read first), with what it takes to build it again."""
    history = monitor.history  # reads what is recorded and not read yet
    layout = {
        "metrics": list(monitor.metrics),
        "info": list(monitor.info_names),
        "x_label": monitor.x_label,
        "groups": {title: list(members) for title, members in monitor.groups.items()},
        "reduce": monitor.reduce,
    }
    kept = {name: list(values) for name, values in history.items()}
    return (restored, (layout, kept, dict(monitor.info), monitor.status, monitor.stop_reason))


def restored(
    layout: Mapping[str, Any],
    history: dict[str, list[Any]],
    info: dict[str, Any],
    status: object,
    stop_reason: str | None,
) -> SavedMonitor:
    """The SavedMonitor `saved_state` describes."""
    monitor = SavedMonitor(**layout)
    monitor._history = history
    monitor.info = info
    monitor.status = status
    if stop_reason is not None:
        monitor.request_stop(stop_reason)
    monitor._closed = True
    return monitor


copyreg.pickle(TrainingMonitor, saved_state)
copyreg.pickle(SavedMonitor, saved_state)
