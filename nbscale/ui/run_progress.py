"""`nbscale.show(run)` for a run of `nbscale.train_async`: the same training-progress display as `nbscale.train`
(nbscale.ui.progress), fed from the events the worker sends and drawn by a thread, so the notebook stays free."""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from nbscale.training.events import StopSignal, TrainingDone, TrainingStarted
from nbscale.ui.cell_outputs import CellOutputs, kernel_shell
from nbscale.ui.progress import TrainingProgress
from nbscale.ui.progress_figure import figure_for_run

if TYPE_CHECKING:
    from nbscale.training.runs import TrainingRun

_ENDED = object()  # queued when the run ends
_STATES_ENDED = ("done", "failed", "cancelled")


class RunProgress(TrainingProgress):
    """TrainingProgress for a pool run: its Stop asks the run to stop (run.stop()); its thread draws."""

    holds_the_cell = False  # the run goes on after show()'s cell; its end removes the button
    redraws_when_done = True

    def __init__(self, run: TrainingRun) -> None:
        stop = StopSignal()
        stop.on_request.append(run.stop)
        super().__init__(stop, budget=1.0)  # the figure every FIGURE_MIN_S: drawn here, it slows no training
        self.run = run
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.finished = False  # the run ended and its last figure is drawn
        self.figure_placeholder: Any = None  # the figure's output, made in the showing cell (show_run)

    def _ipython_display_(self) -> None:
        """Shown already, above: as a cell's last value (`nbscale.show(run)`), no repr under the figure."""

    def png(self) -> bytes:
        """The figure as last drawn from the run's events."""
        figure = self._figure or figure_for_run(0, 1)
        return figure.render(self.columns)

    def _show_figure(self, bundle: dict[str, Any]) -> Any:
        """The first figure replaces the placeholder shown in the showing cell: a drawing thread makes no new
        output, which a client running a later cell would drop (nbscale.ui.cell_outputs)."""
        if self.figure_placeholder is None:
            return super()._show_figure(bundle)
        self.figure_placeholder.update(bundle, raw=True)
        return self.figure_placeholder

    def _info_rows(self) -> list[tuple[str, str]]:
        from nbscale.training.run_table import run_row

        return [("Run", f"{self.run.name}: {run_row(self.run)['options']}"), *super()._info_rows()]

    def follow(self, pin: Any) -> None:
        """The drawing thread: every event in turn until the run ends."""
        pin()
        try:
            while True:
                try:
                    event = self.events.get(timeout=self.info_interval)
                except queue.Empty:  # no events for a while (a slow iteration): the clock ticks all the same
                    if self.start is not None and self.done is None:
                        self._draw_due(time.perf_counter())
                    continue
                if event is _ENDED:
                    break
                self(event)
            if self.done is None:  # failed or cancelled: no TrainingDone came
                self.state = f"Run {self.run.state}" + (f": {self.run.error}" if self.run.error else "")
            self._draw(final=True)
        finally:
            self._close_button()
            self.finished = True


def show_run(run: TrainingRun) -> RunProgress:
    """Show `run`'s progress below the cell and return at once (what it trained before is drawn first)."""
    from IPython.display import display

    view = RunProgress(run)
    view.state = "Waiting for a worker" if run.state == "queued" else "Starting"
    view._open_panel()  # the Stop button and the info panel at once, in this cell; the figure at the first events
    view.figure_placeholder = display(
        {"text/plain": "<training progress figure: waiting for the first iterations>"}, raw=True, display_id=True
    )
    shell = kernel_shell()
    outputs = CellOutputs(shell) if shell is not None else None
    if outputs is not None:  # updates reach this cell's outputs in a client that is running a later cell too
        view.info_handle, view.button_handle = outputs.mirrored(view.info_handle), outputs.mirrored(view.button_handle)
        view.figure_placeholder = outputs.mirrored(view.figure_placeholder)
    run.subscribe_events(view.events.put, _history)
    # a run's listeners hear its end before its future is done: its state says it
    run.subscribe(lambda r: view.events.put(_ENDED) if r.state in _STATES_ENDED else None)
    if run.state in _STATES_ENDED:
        view.events.put(_ENDED)
    pin = outputs.pin if outputs is not None else (lambda: None)
    threading.Thread(target=view.follow, args=(pin,), name=f"nbscale-run-{run.name}", daemon=True).start()
    return view


def _history(run: TrainingRun) -> list[Any]:
    """The events of what `run` trained before it was shown, rebuilt from its info."""
    from nbscale.training.events import IterationDone

    info = run.info
    if not info.iteration:
        return []
    events: list[Any] = [
        TrainingStarted(
            info.max_epochs,
            info.iterations_per_epoch,
            info.mini_batch_size,
            info.hardware,
            run.started_at or 0.0,
            info.iteration[0],
            metric_names=info.metric_names,
            objective_metric=info.objective_metric,
            objective_goal=info.objective_goal,
        )
    ]
    for index, iteration in enumerate(info.iteration):
        events.append(
            IterationDone(
                info.epoch[index],
                iteration,
                info.time[index],
                info.training_loss[index],
                info.training_accuracy[index],
                info.learn_rate[index],
                0,
                info.validation_loss[index],
                info.validation_accuracy[index],
                training_metrics={name: values[index] for name, values in info.metrics.items()},
                validation_metrics={name: values[index] for name, values in info.validation_metrics.items()}
                if info.validation_loss[index] is not None
                else None,
            )
        )
    if run.done() and info.stop_reason:
        events.append(
            TrainingDone(
                info.stop_reason,
                info.epoch[-1],
                info.iteration[-1],
                info.time[-1],
                info.output_network_iteration,
                info.images_per_second,
            )
        )
    return events
