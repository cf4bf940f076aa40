"""The live display of training runs on the pool: one figure comparing every run, a table, Cancel buttons.

Used by `nbscale.sweep` (many runs) and `nbscale.show` (one run). Runs record their events on the pool's
receiver thread; a refresher thread of this display redraws at most every `min_interval` seconds, so neither
the pool nor the notebook waits for matplotlib. The figure is a PNG (Agg canvas, no pyplot) and the table an
HTML output, both replaced through display handles, so the last ones stay in the saved notebook. The buttons
are the only widgets, and are removed when every run has ended.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Sequence
from typing import Any

from nbscale.train.run_table import RunsTable, ranked
from nbscale.train.runs import TrainingRun
from nbscale.ui.progress_figure import smoothed
from nbscale.ui.runs_table import runs_table_bundle

_ENDED = ("done", "failed", "cancelled")


class SweepDisplay:
    """Live figure + table + a Cancel (and optionally Stop) button per run, refreshed off the main thread."""

    def __init__(self, runs: Sequence[TrainingRun], title: str = "", min_interval: float = 1.0,
                 stop_buttons: bool = False) -> None:
        self.runs, self.title, self.min_interval = list(runs), title, min_interval
        self.stop_buttons = stop_buttons
        self.figure_handle: Any = None
        self.table_handle: Any = None
        self.buttons_handle: Any = None
        self.buttons: dict[str, list[Any]] = {}
        self.finished = False
        self._dirty = threading.Event()
        self._draw_lock = threading.Lock()
        self._undo_routes: list[Any] = []

    def _ipython_display_(self) -> None:
        """Already shown by `show()`: a cell ending in `nbscale.show(run)` adds nothing."""

    # ---- life cycle --------------------------------------------------------------------------------------------

    def show(self) -> None:
        """Display the figure, the table and the buttons, and start redrawing as the runs train."""
        from IPython.display import display

        from nbscale.ui.click_routing import route_clicks_off_main_thread

        self.buttons_handle = display(self._button_box(), display_id=True)
        for buttons in self.buttons.values():
            for button in buttons:  # clicks are handled even while a blocking sweep holds the cell
                undo = route_clicks_off_main_thread(button)
                if undo is not None:
                    self._undo_routes.append(undo)
        self.table_handle = display(runs_table_bundle(RunsTable(self.title or "Runs", tuple(self.runs))), raw=True,
                                    display_id=True)
        self.figure_handle = display({"text/plain": "<sweep figure: waiting for the first iterations>"}, raw=True,
                                     display_id=True)
        for run in self.runs:
            run.subscribe(self._on_change)
        threading.Thread(target=self._refresh_forever, name="nbscale-sweep-display", daemon=True).start()

    def _on_change(self, run: TrainingRun) -> None:
        """A run sent events or ended (pool thread): draw later, or finish now when the last run ended."""
        if all(r.state in _ENDED for r in self.runs):
            self.finish()
        else:
            self._dirty.set()

    def _refresh_forever(self) -> None:
        while not self.finished and not all(run.done() for run in self.runs):
            if self._dirty.wait(0.25):
                self._dirty.clear()
                started = time.perf_counter()
                self.draw()
                pause_until = time.perf_counter() + max(self.min_interval, 20 * (time.perf_counter() - started))
                while time.perf_counter() < pause_until and not self.finished:  # drawing takes at most a twentieth of the time
                    time.sleep(0.1)
        self.finish()

    def draw(self) -> None:
        """Redraw the figure and the table now."""
        with self._draw_lock:
            if self.finished or self.figure_handle is None:
                return
            self._update_buttons()
            self.table_handle.update(runs_table_bundle(RunsTable(self.title or "Runs", tuple(self.runs))), raw=True)
            if any(run.info.iteration for run in self.runs):
                self.figure_handle.update({"image/png": self.png(), "text/plain": "<sweep figure>"}, raw=True)

    def finish(self) -> None:
        """Last figure, the results table best first, and no buttons left (idempotent)."""
        with self._draw_lock:
            if self.finished or self.figure_handle is None:
                return
            self.finished = True
            if any(run.info.iteration for run in self.runs):
                self.figure_handle.update({"image/png": self.png(), "text/plain": "<sweep figure>"}, raw=True)
            runs = ranked(self.runs) if len(self.runs) > 1 else self.runs
            title = "Results (best first)" if len(self.runs) > 1 else "Result"
            self.table_handle.update(runs_table_bundle(RunsTable(title, tuple(runs))), raw=True)
            for buttons in self.buttons.values():
                for button in buttons:
                    button.close()
            if self.buttons_handle is not None:
                self.buttons_handle.update({"text/plain": ""}, raw=True)  # no dead widgets in the saved notebook
            for undo in self._undo_routes:
                undo()
            self._undo_routes = []

    # ---- buttons ---------------------------------------------------------------------------------------------

    def _button_box(self) -> object:
        import ipywidgets
        rows = []
        for run in self.runs:
            cancel = ipywidgets.Button(description=f"Cancel {run.name}", icon="times", button_style="warning",
                                       tooltip=f"Cancel {run.name} ({', '.join(map(str, run.params.values()))}); "
                                               "its worker takes the next run",
                                       layout=ipywidgets.Layout(width="auto"))
            cancel.on_click(lambda _button, run=run: run.cancel())
            buttons = [cancel]
            if self.stop_buttons:
                stop = ipywidgets.Button(description="Stop", icon="stop", button_style="danger",
                                         tooltip="Stop at the end of this iteration and keep the network so far",
                                         layout=ipywidgets.Layout(width="auto"))
                stop.on_click(lambda _button, run=run: run.stop())
                buttons.insert(0, stop)
            self.buttons[run.name] = buttons
            rows.extend(buttons)
        return ipywidgets.HBox(rows, layout=ipywidgets.Layout(flex_flow="row wrap"))

    def _update_buttons(self) -> None:
        for run in self.runs:
            if run.done():
                for button in self.buttons.get(run.name, []):
                    if not button.disabled:
                        button.disabled = True

    # ---- the figure ------------------------------------------------------------------------------------------

    def png(self) -> bytes:
        """Accuracy and loss of every run (smoothed training curves, validation points), as a PNG."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(9, 5.2), dpi=72, layout="constrained")
        FigureCanvasAgg(figure)
        accuracy_axes, loss_axes = figure.subplots(2, 1, sharex=True)
        colours = [f"C{i % 10}" for i in range(len(self.runs))]
        for run, colour in zip(self.runs, colours, strict=True):
            info = run.info
            count = len(info.iteration)
            iterations = info.iteration[:count]
            label = f"{run.name} {', '.join(f'{k}={v}' for k, v in run.params.items())}".strip()
            losses = info.training_loss[:count]
            loss_axes.plot(iterations, _smooth(losses), color=colour, linewidth=1.4, label=label)
            accuracies = info.training_accuracy[:count]
            if any(a is not None for a in accuracies):
                accuracy_axes.plot(iterations, _smooth([100 * a if a is not None else float("nan") for a in accuracies]),
                                   color=colour, linewidth=1.4, label=label)
            validated = [(i, vl, va) for i, vl, va in zip(iterations, info.validation_loss[:count],
                                                          info.validation_accuracy[:count], strict=False)
                         if vl is not None]
            if validated:
                x = [v[0] for v in validated]
                loss_axes.plot(x, [v[1] for v in validated], "o--", color=colour, markersize=3, linewidth=0.8)
                if any(v[2] is not None for v in validated):
                    accuracy_axes.plot(x, [100 * v[2] if v[2] is not None else float("nan") for v in validated],
                                       "o--", color=colour, markersize=3, linewidth=0.8)
        accuracy_axes.set_ylabel("Accuracy (%)")
        loss_axes.set_ylabel("Loss")
        loss_axes.set_xlabel("Iteration (lines: training, smoothed; dots: validation)")
        for axes in (accuracy_axes, loss_axes):
            axes.grid(alpha=0.25)
        handles, labels = loss_axes.get_legend_handles_labels()
        if handles:
            accuracy_axes.legend(handles, labels, loc="lower right", fontsize=8)
        if self.title:
            accuracy_axes.set_title(self.title, fontsize=10)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()


def _smooth(values: Sequence[float]) -> list[float]:
    curve: list[float] = []
    for value in values:
        curve.append(smoothed(curve[-1] if curve else None, value))
    return curve
