"""Loggers: every metric of a run (nbscale.train's, or a TrainingMonitor's) written to a CSV file or TensorBoard.

A logger is any object with `log(metrics: dict, step: int)` and `close()`, and maybe `flush()`. nbscale.train
feeds them from the notebook's training events (a pool's events arrive there too), in bunches, and closes them
however the run ends. What they were given reaches the disk (`flush()`) every second and at each epoch's end of
nbscale.train, and at each read or draw of a TrainingMonitor and its `flush()`: a killed kernel loses the last
second or so. A step logged again (a run's final validation, which comes after its iteration) adds to its row.
A logger that raises (a full disk, a custom logger's bug) is dropped with one line naming it, its file and the
step, and the run goes on (`log_rows`).
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nbscale import logger_files
from nbscale.errors import OptionsError
from nbscale.notices import notices
from nbscale.training.events import IterationDone, MetricsRead, MonitorDone, TrainingDone, TrainingStarted

__all__ = ["CSVLogger", "TensorBoardLogger"]


class CSVLogger:
    """One row per step, one column per metric (the columns grow when a metric first appears, e.g. the first
    validation: the file is then rewritten with the wider header). Empty cells where a metric was not logged;
    a step logged twice in a row is one row. `flush()` puts what was logged in the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise OptionsError(f"CSVLogger({str(path)!r}) is a folder: give a file name, such as 'runs/run1.csv'.")
        self.owner = f"CSVLogger({str(path)!r})"
        logger_files.prepare_folder(self.path.parent, self.owner)
        logger_files.open_file(self.path, self.owner).close()  # refused now, not at the first step
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []
        self._file: Any = None
        self._writer: Any = None
        self._last_row_at = 0  # where the last row starts in the file: a step logged again rewrites it alone

    def log(self, metrics: dict[str, Any], step: int) -> None:
        again = bool(self.rows) and self.rows[-1]["step"] == step
        if again:
            self.rows[-1].update(metrics)
        else:
            self.rows.append({"step": step, **metrics})
        new = [name for name in metrics if name not in self.columns]
        if new or self._file is None:
            self.columns += new
            self._rewrite()
            return
        if again:
            self._file.seek(self._last_row_at)
            self._file.truncate()
        else:
            self._last_row_at = self._file.tell()
        self._writer.writerow(self.rows[-1])

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rewrite(self) -> None:
        """The whole file anew, in a temporary file moved over it (a kill meanwhile leaves the old one)."""
        self.close()
        written = self.path.with_name(self.path.name + ".partial")
        with logger_files.open_file(written, self.owner) as file:
            writer = csv.DictWriter(file, self.columns, restval="")
            writer.writeheader()
            writer.writerows(self.rows[:-1])
            last_row_at = file.tell()
            writer.writerows(self.rows[-1:])
        os.replace(written, self.path)
        self._file = logger_files.open_file(self.path, self.owner, append=True)
        self._writer = csv.DictWriter(self._file, self.columns, restval="")
        self._last_row_at = last_row_at


class TensorBoardLogger:
    """Each metric as a TensorBoard scalar (its name is the tag) under `log_dir` (torch.utils.tensorboard)."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise OptionsError(
                "TensorBoardLogger needs the tensorboard package, which is not installed: "
                "pip install tensorboard (or log to a file with nbscale.loggers.CSVLogger)."
            ) from None
        self.log_dir = Path(log_dir)
        logger_files.prepare_folder(self.log_dir, f"TensorBoardLogger({str(log_dir)!r})", own_folder=True)
        self.writer = SummaryWriter(log_dir=str(log_dir))
        events = self.writer.file_writer
        if events is not None:  # its event file, created with the process's umask
            logger_files.make_private(Path(events.event_writer._file_name))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for name, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def flush_loggers(loggers: Sequence[Any]) -> None:
    """What each logger was given, in its file (a logger without `flush` writes when it likes)."""
    for logger in loggers:
        flush = getattr(logger, "flush", None)
        if callable(flush):
            flush()


def log_rows(loggers: list[Any], rows: Sequence[tuple[dict[str, Any], int]]) -> None:
    """Each row to each logger, then its file written; a logger that raises is dropped from `loggers` with one
    line naming it, its file and the step (`drop_failed`), and the run goes on."""
    for logger in list(loggers):
        step: int | None = None
        try:
            for metrics, step in rows:
                logger.log(metrics, step)
            flush_loggers([logger])
        except Exception as error:  # a full disk, a custom logger's bug: the run's weights and info matter more
            drop_failed(loggers, logger, error, step)


def close_loggers(loggers: list[Any]) -> None:
    """Close each logger; one that raises says so in one line (`drop_failed`) and the others still close."""
    for logger in list(loggers):
        try:
            logger.close()
        except Exception as error:
            drop_failed(loggers, logger, error, None)


def drop_failed(loggers: list[Any], logger: Any, error: Exception, step: int | None) -> None:
    """Drop a logger that raised, with one warning line naming it, its file, the step and what failed."""
    if logger in loggers:
        loggers.remove(logger)
    where = getattr(logger, "path", None) or getattr(logger, "log_dir", None)
    named = f"{type(logger).__name__}" + (f" writing {str(where)!r}" if where is not None else "")
    when = f"at step {step}" if step is not None else "while closing"
    notices.warning(
        f"Warning: {named} failed {when} ({type(error).__name__}: {error}). It is dropped and training goes on "
        "without it; what it logged before is in its file. Free space there (df -h) or fix the logger."
    )


class LoggerFeed:
    """Listener for the training event channel: each iteration's loss, metrics, learn rate and validation, handed
    to the loggers (and flushed) every `interval` seconds, at each epoch's end and at the end."""

    def __init__(self, loggers: Sequence[Any], interval: float = 1.0) -> None:
        self.loggers, self.interval = list(loggers), interval
        self.rows: list[tuple[dict[str, Any], int]] = []
        self.next = time.perf_counter() + interval
        self.iterations_per_epoch = 0
        self.last_logged: int | None = None  # the step of the last row handed to the loggers
        self.closed = False

    def __call__(self, event: object) -> None:
        if isinstance(event, IterationDone):
            self.rows.append((iteration_row(event), event.iteration))
            per_epoch = self.iterations_per_epoch
            if time.perf_counter() >= self.next or (per_epoch and event.iteration % per_epoch == 0):
                self.flush()
        elif isinstance(event, TrainingStarted):
            self.iterations_per_epoch = event.iterations_per_epoch
        elif isinstance(event, TrainingDone):
            if event.validation_loss is not None:
                validation = _validation(event.validation_loss, event.validation_metrics, event.validation_accuracy)
                self._final_validation(validation, event.iteration)
            self.flush()

    def _final_validation(self, validation: dict[str, Any], iteration: int) -> None:
        """The validation of the run's last iteration, which comes after it: into its row, or logged at its step."""
        if self.rows and self.rows[-1][1] == iteration:
            self.rows[-1][0].update(validation)
        elif self.last_logged == iteration:
            self.rows.append((validation, iteration))

    def flush(self) -> None:
        rows, self.rows = self.rows, []
        log_rows(self.loggers, rows)
        if rows:
            self.last_logged = rows[-1][1]
        self.next = time.perf_counter() + self.interval

    def close(self) -> None:
        """What is left logged, then every logger closed (once)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            close_loggers(self.loggers)


class MonitorLogs:
    """Listener for a TrainingMonitor's events: each read's rows handed to the loggers (and their files written),
    the loggers closed when the monitor is (MonitorDone)."""

    def __init__(self, loggers: list[Any]) -> None:
        self.loggers = loggers  # the monitor's own list: a logger that fails is dropped from it (log_rows)

    def __call__(self, event: object) -> None:
        if isinstance(event, MetricsRead) and event.steps:  # at each read, not each record: a killed kernel
            log_rows(self.loggers, [(values, step) for step, values in event.rows()])  # loses one read's rows
        elif isinstance(event, MonitorDone):
            close_loggers(self.loggers)


def iteration_row(event: IterationDone) -> dict[str, Any]:
    """An iteration's figures by name: loss, each metric, learn_rate, and val_loss, val_<metric> when validated."""
    metrics = event.training_metrics if event.training_metrics is not None else {"accuracy": event.training_accuracy}
    row: dict[str, Any] = {"loss": event.training_loss}
    row.update((name, value) for name, value in metrics.items() if value is not None)
    row["learn_rate"] = event.learn_rate
    if event.validation_loss is not None:
        row.update(_validation(event.validation_loss, event.validation_metrics, event.validation_accuracy))
    return row


def _validation(loss: float, metrics: dict[str, float | None] | None, accuracy: float | None) -> dict[str, Any]:
    metrics = metrics if metrics is not None else {"accuracy": accuracy}
    return {"val_loss": loss, **{f"val_{name}": value for name, value in metrics.items() if value is not None}}
