"""A TrainingMonitor's display: the Stop button, the info panel and the same progress figure as nbscale.train's
(nbscale.ui.progress_figure), with one panel per metric or group of the user's own loop. A listener on the
monitor's events (nbscale.training.events: MetricsRead, PanelScale, MonitorDone)."""

from __future__ import annotations

import time
from html import escape
from typing import Any

from nbscale.training.events import MetricsRead, MonitorDone, PanelScale, StopSignal
from nbscale.ui import widget_front_end
from nbscale.ui.click_routing import displayed_and_routed
from nbscale.ui.display_flush import flush_only_waiting_streams
from nbscale.ui.live_clock import FIGURE_BUDGET, FigureClock
from nbscale.ui.progress import format_duration
from nbscale.ui.progress_figure import _MORE_COLOURS, Panel, ProgressFigure, Series
from nbscale.ui.stop_button import say_stop_needs_the_interrupt, stop_button

STOP_TOOLTIP = "Set monitor.stop, for the loop to end itself (the kernel interrupt does too)"


def monitor_panels(panels: list[tuple[str, list[str]]]) -> tuple[Panel, ...]:
    """One figure panel per (title, series) pair, each series a raw and a smoothed curve in its own colour."""
    out = []
    index = 0
    for title, names in panels:
        series = []
        for name in names:
            colours = _MORE_COLOURS[index % len(_MORE_COLOURS)] if index else ("#f4b183", "#d95319")
            series.append(Series(name, "validation" if is_validation(name) else "train", name, colours))
            index += 1
        out.append(Panel(title, tuple(series), rising="acc" in title.lower()))
    return tuple(out)


def is_validation(name: str) -> bool:
    """Whether a monitor's metric is a validation series (named val_..., validation..., ValidationLoss...): drawn
    as points, as train's figure draws validation, not smoothed into a line between its sparse values."""
    lowered = name.lower()
    return lowered.startswith("validation") or lowered.startswith("val_") or name.startswith("Val")


class MonitorDisplay:
    """Draws a monitor's figure columns (kept by its listener nbscale.ui.figure_columns, which hears each read
    first) and each read's info; built in the notebook, for a monitor there or the one view of a %%spmd cell's."""

    def __init__(
        self,
        stop: StopSignal,
        panels: list[tuple[str, list[str]]],
        x_label: str,
        columns: dict[str, list[float]],
        holds_the_cell: bool = True,
        budget: float = FIGURE_BUDGET,
        start: float | None = None,
        first_rows: tuple[tuple[str, str], ...] = (),
        stop_tooltip: str = STOP_TOOLTIP,
    ) -> None:
        from IPython.display import display

        self.stop = stop
        self.columns = columns
        self.info: dict[str, Any] = {}
        self.progress: float | None = None
        self.start = time.time() if start is None else start
        self.end: float | None = None  # the MonitorDone's time: the elapsed time stops there
        self.first_rows = first_rows  # shown above the info panel's own rows (a job's display: which job)
        self.figure_clock = FigureClock(time.perf_counter(), budget)
        self.x_label = x_label.capitalize()
        self.step: float | None = None  # the last step drawn, shown in the info panel under the x label
        self.status: object = None  # monitor.status (MATLAB's monitor.Status), shown under the state
        self.figure = ProgressFigure(0, 1, monitor_panels(panels), x_label=x_label.capitalize())
        self.button = stop_button(stop, stop_tooltip)
        flush_only_waiting_streams()  # updates without two round trips to the IO thread each
        self.button_handle, self._click_route = displayed_and_routed(self.button)
        if self._click_route is None and holds_the_cell:
            say_stop_needs_the_interrupt(self.button)
        self.info_handle = display(self._info_bundle({}, None, "Running"), raw=True, display_id=True)
        self.shown_png = b""  # the figure as last drawn: the PNG beside a live figure
        self.figure_handle = display(self._figure_bundle({}), raw=True, display_id=True)
        self.live: Any = None  # a LiveFigure (nbscale.ui.live_figure), where the front end draws widgets

    def _go_live(self) -> None:
        """Where this kernel's front end draws widgets, the figure becomes a LiveFigure beside the PNG last drawn."""
        if widget_front_end.known():
            from nbscale.ui.live_figure import show_live

            bundle = {"image/png": self.shown_png, "text/plain": "<training progress figure>"}
            self.live = show_live(self.figure_handle, self.figure, bundle)

    def __call__(self, event: object) -> None:
        """A monitor's event: a read drawn (the figure when flushed or when its clock says so), a panel's scale
        set, or the end drawn with its state and the Stop button removed."""
        if isinstance(event, MetricsRead):
            self.info, self.progress = event.info, event.progress
            state = "Stopping" if self.stop.requested else "Running"
            self.draw(self.columns, self.info, self.progress, state, event.flushed, event.status)
        elif isinstance(event, PanelScale):
            self.set_log(event.panel, event.log)
        elif isinstance(event, MonitorDone):
            self.end = event.end_time
            state = f"{event.state}: {event.stop_reason}" if event.stop_reason else event.state
            try:
                self.draw(self.columns, self.info, self.progress, state, status=self.status)
            finally:
                self.close()

    def set_log(self, panel: int, log: bool) -> None:
        self.figure.set_log(panel, log)
        if self.live is not None:
            self.live.follow(self.figure)

    def draw(
        self,
        columns: dict[str, list[float]],
        info: dict[str, Any],
        progress: float | None,
        state: str,
        figure: bool = True,
        status: object = None,
    ) -> None:
        """The info panel; the figure too when `figure` is True, or when its clock says so (nbscale.ui.live_clock)."""
        self.step = _last_step(columns, self.step)
        self.columns, self.progress = columns, progress
        now = time.perf_counter()
        if self.live is None:
            self._go_live()
        if self.live is not None:  # drawn in the browser: its new points, at each read
            self.live.push(columns, progress)
        elif figure or self.figure_clock.due(now):
            self.figure_handle.update(self._figure_bundle(columns, progress), raw=True)
            self.figure_clock.drew(now, time.perf_counter() - now)
        self.status = status
        self.info_handle.update(self._info_bundle(info, progress, state), raw=True)

    def close(self) -> None:
        """The last figure as a PNG in place of a live one; remove the Stop button (no dead widget in the saved
        notebook) and its subshell."""
        if self.live is not None:
            self.live.end()
            self.live = None
            self.figure_handle.update(self._figure_bundle(self.columns, self.progress), raw=True)
        if self.button is not None:
            self.button.close()
            self.button = None
            self.button_handle.update({"text/plain": ""}, raw=True)
        if self._click_route is not None:
            self._click_route()
            self._click_route = None

    def _figure_bundle(self, columns: dict[str, list[float]], progress: float | None = None) -> dict[str, Any]:
        self.shown_png = self.figure.render(columns, progress)
        return {"image/png": self.shown_png, "text/plain": "<training progress figure>"}

    def _info_bundle(self, info: dict[str, Any], progress: float | None, state: str) -> dict[str, str]:
        rows = [
            *self.first_rows,
            ("State", state),
            *([("Status", str(self.status))] if self.status not in (None, "") else []),
            ("Start", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.start))),
            ("Elapsed", format_duration((time.time() if self.end is None else self.end) - self.start)),
        ]
        if progress is not None:
            rows.append(("Progress", f"{progress:.0f}%"))
        if self.step is not None:
            rows.append((self.x_label, str(int(self.step)) if float(self.step).is_integer() else f"{self.step:.6g}"))
        rows += [(name, _shown(value)) for name, value in info.items()]
        html = "".join(
            f"<tr><td style='text-align:left;padding-right:1em'><b>{escape(k)}</b></td>"
            f"<td style='text-align:left'>{escape(v)}</td></tr>"
            for k, v in rows
        )
        text = "\n".join(f"{k}: {v}" for k, v in rows)
        bar = ""
        if progress is not None:
            done = max(0.0, min(progress, 100.0))
            bar = (
                f"<div style='width:300px;height:8px;background:#e0e0e0;margin:2px 0 4px 0'>"
                f"<div style='width:{done:.1f}%;height:8px;background:#0072bd'></div></div>"
            )
        return {"text/html": f"{bar}<table style='font-size:12px'>{html}</table>", "text/plain": text}


def _shown(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _last_step(columns: dict[str, list[float]], previous: float | None) -> float | None:
    """The highest step any metric's column reached (the x values recorded last), or `previous` when none."""
    ends = [column[-1] for key, column in columns.items() if key.endswith("_iteration") and column]
    return max(ends) if ends else previous
