"""verbose=True: MATLAB's progress table, one row every verbose_frequency iterations and on validation.

Above it, where the data are held and how long reading them took; while they are read, where no training-progress
display shows it, a line counting the files read, rewritten in place.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import TYPE_CHECKING, TextIO

from nbscale.training.events import IterationDone, PreparingData, StopSignal, TrainingDone, TrainingStarted

if TYPE_CHECKING:
    from nbscale.training.events import Event

_HEADER = (
    "Epoch",
    "Iteration",
    "Time Elapsed",
    "Mini-batch Accuracy",
    "Validation Accuracy",
    "Mini-batch Loss",
    "Validation Loss",
    "Base Learning Rate",
)


def header(metric_names: tuple[str, ...]) -> tuple[str, ...]:
    """MATLAB's columns, with a mini-batch and a validation column per metric (accuracy's as MATLAB names them)."""
    cells: list[str] = []
    for name in metric_names:
        title = {"accuracy": "Accuracy", "rmse": "RMSE", "mae": "MAE"}.get(name, name)
        cells += [f"Mini-batch {title}", f"Validation {title}"]
    return (*_HEADER[:3], *cells, *_HEADER[5:])


class VerboseTable:
    """Listener for the training event channel that prints the verbose table."""

    def __init__(
        self, frequency: int, stop: StopSignal | None = None, stream: TextIO | None = None, preparing: bool = False
    ) -> None:
        """`preparing`: show how far reading the data before training has come, on one line rewritten in place
        (where no training-progress display shows it)."""
        self.frequency, self.stop, self.stream = int(frequency), stop, stream
        self.preparing = preparing
        self.preparing_line = ""
        self.next_preparing = 0.0
        self.total = 0
        self.last: IterationDone | None = None
        self.last_printed = 0
        self.metric_names: tuple[str, ...] = ("accuracy",)
        self.header: tuple[str, ...] = _HEADER
        self.widths = [max(len(h), 9) for h in self.header]

    def __call__(self, event: Event) -> None:
        if isinstance(event, PreparingData):
            if self.preparing and not self.total:  # not amid the table (a pool restarted mid-run reads again)
                self._print_preparing(event)
        elif isinstance(event, TrainingStarted):
            self.total = event.max_epochs * event.iterations_per_epoch
            self.metric_names = tuple(event.metric_names)
            self.header = header(self.metric_names)
            self.widths = [max(len(h), 9) for h in self.header]
            rule = "|" + "|".join("=" * (w + 2) for w in self.widths) + "|"
            if self.preparing_line:  # the count stays as it ended, on its own line
                self._write("\n")
            if event.data_placement:
                self._print(
                    f"Data: {event.data_placement}; read in {event.prepare_seconds:.1f} s before training "
                    "(not in Time Elapsed)."
                )
            if event.compile_seconds:
                self._print(f"Compiled in {event.compile_seconds:.1f} s before training (not in Time Elapsed).")
            chosen = [f"Chosen: {event.choices}."] if event.choices else []  # "auto", learn_rate_scaling
            self._print(f"Training on {event.hardware}.", *chosen, rule, self._row(self.header), rule)
        elif isinstance(event, IterationDone):
            self.last = event
            due = event.iteration == 1 or event.iteration % self.frequency == 0 or event.iteration == self.total
            if due or event.validation_loss is not None:
                self._print_event(event)
        elif isinstance(event, TrainingDone):
            last = self.last
            if last is not None and event.validation_loss is not None and event.iteration == last.iteration:
                # validated after its row was due (a stop asked as its event went out): its row with the figures
                last = dataclasses.replace(
                    last,
                    validation_loss=event.validation_loss,
                    validation_accuracy=event.validation_accuracy,
                    validation_metrics=event.validation_metrics,
                )
                self.last_printed = -1  # printed again, now with them
            if last is not None and self.last_printed != last.iteration:
                self._print_event(last)
            rule = "|" + "|".join("=" * (w + 2) for w in self.widths) + "|"
            # the notebook knows why a stop it asked for happened (pool workers only know it was asked)
            reason = (self.stop.reason if self.stop is not None else None) or event.stop_reason
            self._print(rule, f"Training finished: {reason}.")

    def _print_event(self, e: IterationDone) -> None:
        def percent(v: float | None) -> str:
            return "" if v is None else f"{100 * v:.2f}%"

        def number(v: float | None) -> str:  # a diverging loss in powers of ten, so the columns stay aligned
            return "" if v is None else f"{v:.4f}" if abs(v) < 1e6 else f"{v:.4e}"

        seconds = int(e.time_since_start)
        elapsed = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        training = e.training_metrics if e.training_metrics is not None else {"accuracy": e.training_accuracy}
        validation = e.validation_metrics if e.validation_metrics is not None else {"accuracy": e.validation_accuracy}
        cells: list[str] = []
        for name in self.metric_names:
            shown = percent if name == "accuracy" else number
            cells += [shown(training.get(name)), shown(validation.get(name) if e.validation_loss is not None else None)]
        self._print(
            self._row(
                (
                    str(e.epoch),
                    str(e.iteration),
                    elapsed,
                    *cells,
                    number(e.training_loss),
                    number(e.validation_loss),
                    f"{e.learn_rate:.4g}",
                )
            )
        )
        self.last_printed = e.iteration

    def _print_preparing(self, event: PreparingData) -> None:
        """Rewrite the line (a carriage return) at most every PREPARING_EVERY_S seconds, and at each part's end."""
        now = time.perf_counter()
        if now < self.next_preparing and event.done < event.total:
            return
        self.next_preparing = now + PREPARING_EVERY_S
        line = f"Preparing data: {event.what}: {event.done:,} of {event.total:,} {event.unit}"
        self._write("\r" + line.ljust(len(self.preparing_line)))
        self.preparing_line = line

    def _row(self, cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, self.widths, strict=True)) + " |"

    def _print(self, *lines: str) -> None:
        self._write("\n".join(lines) + "\n")

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stdout
        stream.write(text)
        stream.flush()


PREPARING_EVERY_S = 1.0
