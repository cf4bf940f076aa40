"""`job.show()` of a TrainingMonitor's loop in a %%batch job: the monitor's own display (its panels, info fields,
x label and Stop), fed from the events the job recorded (a MonitorStarted, then its reads and its MonitorDone),
as the notebook's display of a monitor is fed from the monitor itself."""

from __future__ import annotations

from nbscale.training.events import MetricsRead, MonitorDone, MonitorStarted, PanelScale, StopSignal
from nbscale.ui.figure_columns import FigureColumns
from nbscale.ui.monitor_display import MonitorDisplay

STOP_TOOLTIP = "Ask the job's loop to stop: monitor.stop becomes True there, and the loop ends itself"


class RecordedMonitor:
    """A job's monitor record drawn: `__call__` takes its events; `redraw()` at each poll; `done` once it ended."""

    def __init__(self, number: int, label: str, started: MonitorStarted, stop: StopSignal) -> None:
        self.number = number  # which of the job's trainings
        self.start = started
        self.done: MonitorDone | None = None
        self.figure = FigureColumns(started.metrics)
        panels = [(title, list(names)) for title, names in started.panels]
        self.display = MonitorDisplay(
            stop,
            panels,
            started.x_label,
            self.figure.columns,
            holds_the_cell=False,
            start=started.start_time,
            first_rows=(("Job", label),),
            stop_tooltip=STOP_TOOLTIP,
        )
        self.job_state: str | None = None

    def __call__(self, event: object) -> None:
        if isinstance(event, MetricsRead):
            self.figure(event)
            self.display(event)
        elif isinstance(event, PanelScale):
            self.display(event)
        elif isinstance(event, MonitorDone) and self.done is None:
            self.done = event
            self.display(event)

    def redraw(self) -> None:
        """The info panel (its clock ticks between reads), the figure when its clock says so."""
        if self.done is None and self.job_state is None:
            state = "Stopping" if self.display.stop.requested else "Running"
            d = self.display
            d.draw(d.columns, d.info, d.progress, state, figure=False, status=d.status)

    def job_ended(self, state: str, error: str | None) -> None:
        """The job ended before the monitor closed (it failed, was cancelled, or its process died); `error` only
        where it says more than `state`."""
        if self.done is not None or self.job_state is not None:
            return
        self.job_state = state
        d = self.display
        try:
            d.draw(d.columns, d.info, d.progress, f"Job {state}" + (f": {error}" if error else ""), status=d.status)
        finally:
            d.close()
