"""The live training-progress display: accuracy and loss panels, an info panel and a Stop button.

The figure (nbscale.ui.progress_figure) is a PNG that replaces the previous one through a display handle, so
the last figure stays in the saved notebook as a plain image/png and shows in nbconvert's HTML. The info panel
is an HTML output updated the same way. Only the Stop button is a widget; it is closed at the end. While the data
are read before training (PreparingData events), the button and the info panel show already, with the count of
files read; the panel then says where the data are held and how long reading them took.

The figure is built and first shown (empty) before the first iteration. The info panel and the figure are
redrawn on two clocks (nbscale.ui.live_clock): the panel every `info_interval` seconds (0.5), so it is never a
second behind; the figure every 1 to 2 s, as often as `budget` of the time allows (1%), never more than 2 s apart.
"""

from __future__ import annotations

import threading
import time
from html import escape
from typing import TYPE_CHECKING, Any

from nbscale.training.events import (
    IterationDone,
    PreparingData,
    StopSignal,
    TrainingDone,
    TrainingRestarted,
    TrainingStarted,
)
from nbscale.ui import widget_front_end
from nbscale.ui.click_routing import displayed_and_routed
from nbscale.ui.display_flush import flush_only_waiting_streams
from nbscale.ui.live_clock import FIGURE_BUDGET, INFO_INTERVAL_S, FigureClock
from nbscale.ui.panel_ticker import PanelTicker
from nbscale.ui.progress_figure import ProgressFigure, extend_smoothed, figure_for_run, is_drop, metric_panels
from nbscale.ui.stop_button import STOP_TOOLTIP, say_stop_needs_the_interrupt, stop_button

if TYPE_CHECKING:
    from nbscale.training.events import Event
    from nbscale.ui.live_figure import LiveFigure


FIGURE_TEXT = "<training progress figure>"


class TrainingProgress:
    """Listener for the training event channel that draws the training-progress display."""

    holds_the_cell = True  # training runs in the cell that shows it (a job monitor may follow from a thread)
    redraws_when_done = False  # a job monitor redraws a finished training; this display hands its figure on
    stop_tooltip = STOP_TOOLTIP

    def __init__(self, stop: StopSignal, info_interval: float = INFO_INTERVAL_S, budget: float = FIGURE_BUDGET) -> None:
        self.stop, self.info_interval = stop, info_interval
        self.start: TrainingStarted | None = None
        self.metric_names: tuple[str, ...] = ("accuracy",)
        self.columns: dict[str, list[float]] = metric_columns(self.metric_names)
        self.restarts: list[str] = []
        self.last: IterationDone | None = None
        self.done: TrainingDone | None = None
        self.state = "Starting"
        self.next_info = 0.0  # a perf_counter time: the first iteration shows at once
        self.figure_clock = FigureClock(time.perf_counter(), budget)
        self.figure_handle: Any = None
        self.info_handle: Any = None
        self.preparing: PreparingData | None = None  # how far reading the data before training has come
        self._preparing_since = 0.0
        self.button: Any = None
        self._click_route: Any = None
        self._figure: ProgressFigure | None = None
        self.live: LiveFigure | None = None  # the figure drawn in the browser, where the front end draws widgets
        self.shown_png: bytes | None = None  # the figure as last drawn: the PNG beside a live figure
        self.ticker: PanelTicker | None = None  # redraws the info panel between slow iterations (holds_the_cell)
        self._info_lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        if isinstance(event, IterationDone):  # first: this runs every iteration
            if self.last is None:
                self._drop_empty_panels(event)
            self._add(event)
            now = time.perf_counter()
            if now >= self.next_info:
                self.state = "Training"
                self._draw_due(now)
        elif isinstance(event, PreparingData):
            if self.start is None:  # a pool restarted mid-run (on_worker_failure="restart") reads its data again
                self._prepare(event)
        elif isinstance(event, TrainingStarted):
            self._open(event)
        elif isinstance(event, TrainingDone):
            self.state = f"Done: {self.stop.reason or event.stop_reason}"
            self.done = event
            if self._figure is not None and self.start is not None:  # an early stop: the axis spans what ran
                self._figure.end_at(event.iteration)
            if event.validation_loss is not None:  # the last iteration, validated after its event went out
                self._add_validation(
                    event.iteration,
                    event.validation_loss,
                    validation_metrics(event.validation_metrics, event.validation_accuracy),
                )
            self._draw(final=True)
            self._close_button()
            if self._figure is not None and not self.redraws_when_done:
                self._figure.release()
                self._figure = None
        elif isinstance(event, TrainingRestarted):
            self.columns["restart_iteration"].append(event.resumed_after)
            self.restarts.append(event.description)
            self.state = "Restarted after a lost worker"
            self._draw()

    # ---- data ------------------------------------------------------------------------------------------------

    def _add(self, event: IterationDone) -> None:
        c = self.columns
        c["iteration"].append(event.iteration)
        _append_smoothed(c["loss"], c["loss_smooth"], event.training_loss)
        metrics = event.training_metrics
        if metrics is None:  # events from before metric dicts: accuracy only
            metrics = {"accuracy": event.training_accuracy}
        for name in self.metric_names:
            value = metrics.get(name)
            if value is not None:
                _append_smoothed(c[name], c[f"{name}_smooth"], _shown(name, value))
                c[f"{name}_iteration"].append(event.iteration)
        if event.validation_loss is not None:
            self._add_validation(
                event.iteration,
                event.validation_loss,
                validation_metrics(event.validation_metrics, event.validation_accuracy),
            )
        if is_drop(c["learn_rate"][-3:], event.learn_rate):  # confirmed an iteration after the fall
            c["drop_iteration"].append(event.iteration - 1)
            c["drop_rate"].append(event.learn_rate)
        c["learn_rate"].append(event.learn_rate)
        self.last = event

    def _add_validation(self, iteration: int, loss: float, metrics: dict[str, float | None]) -> None:
        c = self.columns
        c["val_iteration"].append(iteration)
        c["val_loss"].append(loss)
        for name in self.metric_names:
            value = metrics.get(name)
            c[f"val_{name}"].append(_shown(name, value) if value is not None else float("nan"))

    # ---- display ---------------------------------------------------------------------------------------------

    def _prepare(self, event: PreparingData) -> None:
        """Reading the data before training: the panel shows how far it has come (opened at the first count)."""
        if self.preparing is None:
            self._preparing_since = time.time()
        self.preparing = event
        self.state = "Preparing data"
        now = time.perf_counter()
        if self.info_handle is None:
            self._open_panel()
        elif now >= self.next_info or event.done >= event.total:  # at most every info_interval, and each part's end
            self._show_info()
        else:
            return
        self.next_info = now + self.info_interval

    def _open(self, event: TrainingStarted) -> None:
        self.start = event
        if event.metric_names != self.metric_names:
            self.metric_names = tuple(event.metric_names)
            self.columns = metric_columns(self.metric_names) | {
                k: v for k, v in self.columns.items() if k.startswith(("restart", "drop"))
            }
        if self.info_handle is None:
            self._open_panel()
        self._figure = figure_for_run(
            event.max_epochs * event.iterations_per_epoch,
            event.iterations_per_epoch,
            metric_panels(self.metric_names, rising_metrics(self.metric_names, event)),
        )
        if self.live is not None:  # a run that starts again in the same display: drawn from its first point
            self.live.follow(self._figure)
        else:
            self.figure_handle = self._show_figure(self._figure_bundle())
        self.figure_clock = FigureClock(time.perf_counter(), self.figure_clock.budget)

    def _drop_empty_panels(self, first: IterationDone) -> None:
        """Metrics the first iteration has no value for (a step_fn returning its loss alone: no outputs to compute
        accuracy on) get no panel: the figure is built again without them. Not for a monitor's loop in a job
        (no iterations per epoch): its sparse metrics, validation among them, come later."""
        metrics = first.training_metrics
        if metrics is None:
            metrics = {"accuracy": first.training_accuracy}
        kept = tuple(name for name in self.metric_names if metrics.get(name) is not None)
        start = self.start
        if kept == self.metric_names or start is None or self._figure is None or not start.iterations_per_epoch:
            return
        self.metric_names = kept
        self._figure = figure_for_run(
            start.max_epochs * start.iterations_per_epoch,
            start.iterations_per_epoch,
            metric_panels(kept, rising_metrics(kept, start)),
        )
        if self.live is not None:
            self.live.follow(self._figure)

    def _show_figure(self, bundle: dict[str, Any]) -> Any:
        """The figure's first output and its display handle (below the info panel)."""
        from IPython.display import display

        return display(bundle, raw=True, display_id=True)

    def _open_panel(self) -> None:
        """The Stop button and the info panel (the figure follows below them once training starts)."""
        from IPython.display import display

        self.button = stop_button(self.stop, self.stop_tooltip)
        flush_only_waiting_streams()  # updates without two round trips to the IO thread each
        self.button_handle, self._click_route = displayed_and_routed(self.button)
        if self.holds_the_cell:  # else clicks are handled once the cell ends, and the button outlives it
            if self._click_route is None:
                say_stop_needs_the_interrupt(self.button)
            self._close_when_the_cell_ends()
        self.info_handle = display(self._info_bundle(), raw=True, display_id=True)
        if self.holds_the_cell:  # else events reach the display from the run's own thread as they come
            self.ticker = PanelTicker(self._show_info)

    def _draw_due(self, now: float) -> None:
        """The info panel, and the figure: its new points where it is drawn in the browser (nbscale.ui.live_figure),
        else a PNG when its clock says so (nbscale.ui.live_clock)."""
        self.next_info = now + self.info_interval
        if self.live is None and self.figure_handle is not None and self._figure is not None:
            self._go_live()
        live_or_due = self.live is not None or self.figure_clock.due(now)
        if live_or_due and self.figure_handle is not None and self._figure is not None:
            self._draw()
            self.figure_clock.drew(now, time.perf_counter() - now)
        elif self.info_handle is not None:
            self._show_info()

    def _go_live(self) -> None:
        """Where this kernel's front end draws widgets, the figure becomes a LiveFigure beside the PNG last drawn
        (not drawn again: a draw is what the live figure saves)."""
        if widget_front_end.known() and self._figure is not None:
            from nbscale.ui.live_figure import show_live

            png = self.shown_png if self.shown_png is not None else self._figure.render(self.columns)
            self.live = show_live(self.figure_handle, self._figure, {"image/png": png, "text/plain": FIGURE_TEXT})

    def _draw(self, final: bool = False) -> None:
        """The figure and the info panel; `final`: the figure as a PNG alone, in place of a live figure (what a
        saved notebook keeps)."""
        if self.figure_handle is None or self._figure is None:  # not started, or done and its figure handed on
            return
        if self.live is not None and not final:
            self.live.push(self.columns)
        else:
            if self.live is not None:
                self.live.end()
                self.live = None
            self.figure_handle.update(self._figure_bundle(), raw=True)
        self._show_info()

    def _show_info(self) -> None:
        """The info panel redrawn (from the cell's thread, or from the ticker's when an iteration is slow)."""
        with self._info_lock:
            self.info_handle.update(self._info_bundle(), raw=True)
            if self.ticker is not None:
                self.ticker.shown()

    def _figure_bundle(self) -> dict[str, Any]:
        assert self._figure is not None
        self.shown_png = self._figure.render(self.columns)
        return {"image/png": self.shown_png, "text/plain": FIGURE_TEXT}

    def _info_bundle(self) -> dict[str, str]:
        rows = self._info_rows()
        html = "".join(
            f"<tr><td style='text-align:left;padding-right:1em'><b>{escape(k)}</b></td>"
            f"<td style='text-align:left'>{escape(v)}</td></tr>"
            for k, v in rows
        )
        text = "\n".join(f"{k}: {v}" for k, v in rows)
        return {"text/html": f"<table style='font-size:12px'>{html}</table>", "text/plain": text}

    def _info_rows(self) -> list[tuple[str, str]]:
        start, last = self.start, self.last
        if start is None:
            rows = [("State", self.state)]
            if self.preparing is not None:
                p = self.preparing
                rows += [
                    ("Preparing data", f"{p.what}: {p.done:,} of {p.total:,} {p.unit}"),
                    ("Preparation", format_duration(time.time() - self._preparing_since)),
                ]
            return rows
        total = start.max_epochs * start.iterations_per_epoch  # 0: a TrainingMonitor's loop in a job
        rows = [
            ("State", self.state),
            ("Start", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start.start_time))),
            ("Elapsed", format_duration(time.time() - start.start_time)),
            ("Hardware", start.hardware),
        ]
        if start.mini_batch_size:
            rows.append(("Mini-batch size", str(start.mini_batch_size)))
        if start.choices:  # mini_batch_size="auto", learn_rate_scaling: what was chosen and why
            rows.append(("Chosen", start.choices))
        if start.data_placement:  # where the data are held, and the time reading them took (not in Elapsed)
            rows += [
                ("Data", start.data_placement),
                ("Preparation", f"{start.prepare_seconds:.1f} s, before training (not in Elapsed)"),
            ]
        if start.compile_seconds:  # compile=...: compiling the step, before training
            rows.append(("Compiling", f"{start.compile_seconds:.1f} s, before training (not in Elapsed)"))
        if last is not None and total:
            rows += [
                ("Epoch", f"{last.epoch} of {start.max_epochs}"),
                ("Iteration", f"{last.iteration} of {total}"),
                ("Learn rate", f"{last.learn_rate:.3g}"),
                ("Throughput", f"{last.images / max(last.time_since_start, 1e-9):,.0f} images/s"),
            ]
        elif last is not None:  # a monitor's own loop: its step, and its epoch and learn rate when it gave them
            rows.append(("Iteration", str(last.iteration)))
            rows += [("Epoch", str(last.epoch))] if last.epoch > 1 else []
            rows += [("Learn rate", f"{last.learn_rate:.3g}")] if last.learn_rate else []
        if self.columns["val_iteration"]:
            rows.append(self._validation_row())
        if self.restarts:
            rows.append(("Restarts", "; ".join(self.restarts)))
        return rows

    def _validation_row(self) -> tuple[str, str]:
        """The last validation figures; once done, those of the returned network (with output_network=
        "best-validation" an earlier iteration's), as `info.final_validation_loss/accuracy` are."""
        c, index, note = self.columns, -1, ""
        done = self.done
        if done is not None and done.output_network_iteration in c["val_iteration"][:-1]:
            index = c["val_iteration"].index(done.output_network_iteration)
            note = f" (the returned network, iteration {done.output_network_iteration})"
        parts = [f"loss {c['val_loss'][index]:.4f}"]
        for name in self.metric_names:
            value = c[f"val_{name}"][index]
            if value == value:
                parts.append(f"accuracy {value:.2f}%" if name == "accuracy" else f"{name} {value:.4g}")
        return ("Validation", ", ".join(parts) + note)

    def _close_when_the_cell_ends(self) -> None:
        """A run that fails sends no TrainingDone: the cell's end removes the button and its subshell then."""
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            shell.events.register("post_run_cell", self._on_cell_end)
            self._shell = shell

    def _on_cell_end(self, _result: object = None) -> None:
        if self.live is not None:  # the run failed: its last figure as a PNG in place of the live one
            self._draw(final=True)
        self._close_button()

    def _close_button(self) -> None:
        if self.ticker is not None:
            self.ticker.end()
            self.ticker = None
        shell = getattr(self, "_shell", None)
        if shell is not None:
            shell.events.unregister("post_run_cell", self._on_cell_end)
            self._shell = None
        if self.button is not None:
            self.button.close()
            self.button = None
            self.button_handle.update({"text/plain": ""}, raw=True)  # no dead widget in the saved notebook
        if self._click_route is not None:
            self._click_route()
            self._click_route = None


RISING = frozenset({"accuracy", "top5-accuracy", "precision", "recall", "fscore"})  # the higher the better


def rising_metrics(names: tuple[str, ...], start: TrainingStarted) -> tuple[str, ...]:
    """The metrics among `names` that grow as training goes: accuracy's kind, and a maximized objective."""
    return tuple(
        n for n in names if n in RISING or (n == start.objective_metric and start.objective_goal == "maximize")
    )


def metric_columns(metric_names: tuple[str, ...]) -> dict[str, list[float]]:
    """The columns a training's figure is drawn from: the loss and each metric, raw, smoothed, at which
    iterations, and validated; learn rates and their drops, restarts."""
    keys = [
        "iteration",
        "loss",
        "loss_smooth",
        "val_iteration",
        "val_loss",
        "learn_rate",
        "drop_iteration",
        "drop_rate",
        "restart_iteration",
    ]
    for name in metric_names:
        keys += [name, f"{name}_smooth", f"{name}_iteration", f"val_{name}"]
    return {k: [] for k in keys}


def validation_metrics(metrics: dict[str, float | None] | None, accuracy: float | None) -> dict[str, float | None]:
    """An event's validation metrics by name (events from before metric dicts carry the accuracy only)."""
    return metrics if metrics is not None else {"accuracy": accuracy}


def _shown(name: str, value: float) -> float:
    """A metric as plotted: accuracy in percent, as MATLAB's figure shows it; others as computed."""
    return 100.0 * value if name == "accuracy" else value


def _append_smoothed(raw: list[float], smooth: list[float], value: float) -> None:
    raw.append(value)
    extend_smoothed(smooth, (value,))


def format_duration(seconds: float) -> str:
    """`seconds` as HH:MM:SS (whole seconds)."""
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}"
