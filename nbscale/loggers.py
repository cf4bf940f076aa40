"""Loggers: every metric of a training run (or of a TrainingMonitor) written as it is read, to a CSV file or to
TensorBoard. `TrainingOptions(loggers=[CSVLogger("runs/a.csv"), TensorBoardLogger("runs/")])`.

A logger is any object with `log(metrics: dict[str, float], step: int)` and `close()`. nbscale's listener calls
`log` from the events the notebook receives in bunches (so logging never adds a host sync to training, on any
execution environment: a pool's events reach the notebook), and `close` once the run ends, however it ends.
Loggers are created in the notebook and are never used on workers; they pickle without their open files.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

from nbscale.errors import OptionsError
from nbscale.train.events import IterationDone, TrainingDone, TrainingStarted

__all__ = ["CSVLogger", "TensorBoardLogger", "TrainingLoggers"]


class CSVLogger:
    """One row per logged step: `step` then one column per metric name seen (a new name adds a column: the file is
    rewritten with it, so every row has every column)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self._file: Any = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {"step": step, **{name: _plain(value) for name, value in metrics.items()}}
        self.rows.append(row)
        new = [name for name in row if name not in self.columns]
        if new or self._file is None:
            self.columns += new
            self._rewrite()
        else:
            csv.DictWriter(self._file, self.columns).writerow(row)
            self._file.flush()

    def _rewrite(self) -> None:
        if self._file is not None:
            self._file.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", newline="")  # noqa: SIM115 - kept open between steps, closed by close()
        writer = csv.DictWriter(self._file, self.columns)
        writer.writeheader()
        writer.writerows(self.rows)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.rows = []  # a later run through the same logger starts a new file
        self.columns = []

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "columns": [], "rows": [], "_file": None}


class TensorBoardLogger:
    """Scalars for TensorBoard in `log_dir` (torch.utils.tensorboard's SummaryWriter, made at the first log)."""

    def __init__(self, log_dir: str | os.PathLike[str] = "runs") -> None:
        self.log_dir = str(log_dir)
        _summary_writer_class()  # a missing tensorboard package is said at once, not at the first iteration
        self._writer: Any = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._writer is None:
            self._writer = _summary_writer_class()(log_dir=self.log_dir)
        for name, value in metrics.items():
            value = _plain(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict[str, Any]:
        return {"log_dir": self.log_dir, "_writer": None}


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise OptionsError("TensorBoardLogger needs the tensorboard package: pip install tensorboard (or use "
                           "nbscale.loggers.CSVLogger).") from None
    return SummaryWriter


def _plain(value: Any) -> Any:
    """A float for a 0-d tensor or numpy scalar; NaN for None (a blank cell in a CSV file)."""
    if value is None:
        return math.nan
    item = getattr(value, "item", None)
    return item() if callable(item) else value


class TrainingLoggers:
    """The event-channel listener that feeds `loggers` every iteration's figures (training loss, learn rate, each
    metric as `training_<name>`, and where it validated `validation_loss`, `validation_<name>`), step = iteration;
    `close()` closes them all (called when the run ends, however it ends)."""

    def __init__(self, loggers: tuple[Any, ...]) -> None:
        self.loggers = loggers
        self.last_iteration = 0

    def __call__(self, event: Any) -> None:
        if isinstance(event, IterationDone):
            self.last_iteration = event.iteration
            figures: dict[str, Any] = {"epoch": event.epoch, "training_loss": event.training_loss,
                                       "learn_rate": event.learn_rate}
            training = event.training_metrics if event.training_metrics is not None else (
                {"accuracy": event.training_accuracy} if event.training_accuracy is not None else {})
            figures.update({f"training_{name}": value for name, value in training.items() if value is not None})
            if event.validation_loss is not None:
                figures["validation_loss"] = event.validation_loss
                validation = event.validation_metrics if event.validation_metrics is not None else (
                    {"accuracy": event.validation_accuracy} if event.validation_accuracy is not None else {})
                figures.update({f"validation_{name}": v for name, v in validation.items() if v is not None})
            self._log(figures, event.iteration)
        elif isinstance(event, TrainingDone) and event.validation_loss is not None:
            figures = {"validation_loss": event.validation_loss}
            figures.update({f"validation_{name}": v for name, v in (event.validation_metrics or {}).items()
                            if v is not None})
            self._log(figures, event.iteration)
        elif isinstance(event, TrainingStarted):
            self.last_iteration = event.first_iteration - 1

    def _log(self, figures: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(figures, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
