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

from nbscale.training.run_table import RunsTable, ranked
from nbscale.training.runs import TrainingRun
from nbscale.ui.cell_outputs import CellOutputs, kernel_shell
from nbscale.ui.progress_figure import extend_smoothed
from nbscale.ui.runs_table import runs_table_bundle

_ENDED = ("done", "failed", "cancelled")


class SweepDisplay:
    """Live figure + table + a Cancel (and optionally Stop) button per run, refreshed off the main thread."""

    def __init__(
        self, runs: Sequence[TrainingRun], title: str = "", min_interval: float = 1.0, stop_buttons: bool = False
    ) -> None:
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
        self.table_handle = display(
            runs_table_bundle(RunsTable(self.title or "Runs", tuple(self.runs))), raw=True, display_id=True
        )
        self.figure_handle = display(
            {"text/plain": "<sweep figure: waiting for the first iterations>"}, raw=True, display_id=True
        )
        shell = kernel_shell()
        if shell is not None:  # redraws reach these outputs in a client running a later cell too (wait=False)
            outputs = CellOutputs(shell)
            self.buttons_handle, self.table_handle, self.figure_handle = (
                outputs.mirrored(handle) for handle in (self.buttons_handle, self.table_handle, self.figure_handle)
            )
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
                while (
                    time.perf_counter() < pause_until and not self.finished
                ):  # drawing takes at most a twentieth of the time
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
            cancel = ipywidgets.Button(
                description=f"Cancel {run.name}",
                icon="times",
                button_style="warning",
                tooltip=f"Cancel {run.name} ({', '.join(map(str, run.params.values()))}); "
                "its worker takes the next run",
                layout=ipywidgets.Layout(width="auto"),
            )
            cancel.on_click(lambda _button, run=run: run.cancel())
            buttons = [cancel]
            if self.stop_buttons:
                stop = ipywidgets.Button(
                    description="Stop",
                    icon="stop",
                    button_style="danger",
                    tooltip="Stop at the end of this iteration and keep the network so far",
                    layout=ipywidgets.Layout(width="auto"),
                )
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
        """The comparison figure (`figure()`) as a PNG."""
        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png")
        return buffer.getvalue()

    def figure(self) -> Any:
        """A panel per metric of the runs (`metrics=`, accuracy in %) then the loss, each with every run's
        smoothed training curve and validation points; the objective's panel says so. A matplotlib Figure on an
        Agg canvas (no pyplot)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        names = self.panel_names()
        figure = Figure(figsize=(9, 1.2 + 2.0 * len(names)), dpi=72, layout="constrained")
        FigureCanvasAgg(figure)
        axes_of = dict(zip(names, figure.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0], strict=True))
        objectives = {run.info.objective_metric for run in self.runs}
        for index, run in enumerate(self.runs):
            label = f"{run.name} {', '.join(f'{k}={v}' for k, v in run.params.items())}".strip()
            for name, axes in axes_of.items():
                _plot_run(axes, run.info, name, f"C{index % 10}", label)
        for name, axes in axes_of.items():
            text = "Accuracy (%)" if name == "accuracy" else "Loss" if name == "loss" else name
            axes.set_ylabel(f"{text}\n(objective)" if name in objectives and name != "loss" else text)
            axes.grid(alpha=0.25)
        axes_of["loss"].set_xlabel("Iteration (lines: training, smoothed; dots: validation)")
        first = axes_of[names[0]]
        handles, labels = axes_of["loss"].get_legend_handles_labels()
        if handles:
            first.legend(handles, labels, loc="best", fontsize=8)
        if self.title:
            first.set_title(self.title, fontsize=10)
        return figure

    def panel_names(self) -> list[str]:
        """The figure's panels, top to bottom: every metric of the runs (in their order, first run first), then
        "loss"."""
        names: list[str] = []
        for run in self.runs:
            names.extend(name for name in run.info.metric_names if name not in names)
        return [*names, "loss"]


def _plot_run(axes: Any, info: Any, name: str, colour: str, label: str) -> None:
    """One run's `name` ("loss" or a metric) on `axes`: the smoothed training curve, then the validation dots."""
    count = len(info.iteration)
    iterations = info.iteration[:count]
    scale = 100.0 if name == "accuracy" else 1.0
    training = info.training_loss[:count] if name == "loss" else info.metrics.get(name, [])[:count]
    validation = info.validation_loss[:count] if name == "loss" else info.validation_metrics.get(name, [])[:count]
    if any(value is not None for value in training):
        axes.plot(
            iterations[: len(training)],
            _smooth([scale * v if v is not None else float("nan") for v in training]),
            color=colour,
            linewidth=1.4,
            label=label,
        )
    validated = [(i, scale * v) for i, v in zip(iterations, validation, strict=False) if v is not None]
    if validated:
        axes.plot(
            [v[0] for v in validated], [v[1] for v in validated], "o--", color=colour, markersize=3, linewidth=0.8
        )


def _smooth(values: Sequence[float]) -> list[float]:
    curve: list[float] = []
    extend_smoothed(curve, values)
    return curve
