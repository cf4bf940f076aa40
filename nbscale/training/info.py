"""`TrainingInfo`: what a training run did, recorded from the event channel (MATLAB's info struct)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from nbscale.suggestions import did_you_mean
from nbscale.training.events import IterationDone, TrainingDone, TrainingRestarted, TrainingStarted

_COLUMNS = (
    "epoch",
    "iteration",
    "time",
    "training_loss",
    "training_accuracy",
    "validation_loss",
    "validation_accuracy",
    "learn_rate",
)


@dataclass
class TrainingInfo:
    """Per-iteration history and the run's outcome.

    History lists have one entry per iteration; validation entries are None on iterations that did not
    validate. Accuracies are fractions in [0, 1] (None for outputs that are not class scores).
    """

    epoch: list[int] = field(default_factory=list)
    iteration: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    training_loss: list[float] = field(default_factory=list)
    training_accuracy: list[float | None] = field(default_factory=list)
    validation_loss: list[float | None] = field(default_factory=list)
    validation_accuracy: list[float | None] = field(default_factory=list)
    learn_rate: list[float] = field(default_factory=list)
    stop_reason: str = ""
    hardware: str = ""
    images_per_second: float = 0.0
    output_network_iteration: int = 0
    max_epochs: int = 0
    iterations_per_epoch: int = 0
    restarts: list[str] = field(default_factory=list)  # one line per pool restart (on_worker_failure="restart")
    mini_batch_size: int = 0  # the global mini-batch trained with (mini_batch_size="auto" settled)
    initial_learn_rate: float | None = None  # the rate trained with (learn_rate_scaling applied)
    choices: str = ""  # what "auto" and learn_rate_scaling chose, and why ("" when nothing was chosen)
    prepare_seconds: float = 0.0  # reading the data before training: not in `time` nor in images_per_second
    data_placement: str = ""  # where the training data were held (resident on the device, or streamed)
    compile_seconds: float = 0.0  # compile=...: compiling the training step, before training (not in `time`)
    metric_names: tuple[str, ...] = ("accuracy",)  # the run's metrics, in display order
    # name -> one value per iteration (None where not computed); validation: None on iterations that did not validate
    metrics: dict[str, list[float | None]] = field(default_factory=lambda: {"accuracy": []})
    validation_metrics: dict[str, list[float | None]] = field(default_factory=lambda: {"accuracy": []})
    objective_metric: str = "loss"  # what patience and "best-validation" followed: "loss" or one of metric_names
    objective_goal: str = "minimize"  # "minimize" or "maximize"

    def record(self, event: Any) -> None:
        """Listener for the event channel."""
        if isinstance(event, IterationDone):  # first and spelt out: this runs every iteration
            self.epoch.append(event.epoch)
            self.iteration.append(event.iteration)
            self.time.append(event.time_since_start)
            self.training_loss.append(event.training_loss)
            self.training_accuracy.append(event.training_accuracy)
            self.validation_loss.append(event.validation_loss)
            self.validation_accuracy.append(event.validation_accuracy)
            self.learn_rate.append(event.learn_rate)
            training = event.training_metrics
            validation = event.validation_metrics
            for name in self.metric_names:
                self.metrics[name].append(
                    training.get(name)
                    if training is not None
                    else event.training_accuracy
                    if name == "accuracy"
                    else None
                )
                self.validation_metrics[name].append(
                    validation.get(name)
                    if validation is not None
                    else event.validation_accuracy
                    if name == "accuracy"
                    else None
                )
        elif isinstance(event, TrainingStarted):
            self.hardware = event.hardware
            self.max_epochs, self.iterations_per_epoch = event.max_epochs, event.iterations_per_epoch
            self.mini_batch_size, self.initial_learn_rate = event.mini_batch_size, event.initial_learn_rate
            self.choices = event.choices
            self.prepare_seconds, self.data_placement = event.prepare_seconds, event.data_placement
            self.compile_seconds = event.compile_seconds
            self.objective_metric, self.objective_goal = event.objective_metric, event.objective_goal
            if tuple(event.metric_names) != self.metric_names and not self.iteration:
                self.metric_names = tuple(event.metric_names)
                self.metrics = {name: [] for name in self.metric_names}
                self.validation_metrics = {name: [] for name in self.metric_names}
        elif isinstance(event, TrainingDone):
            self.stop_reason = self.stop_reason or event.stop_reason
            self.images_per_second = event.images_per_second
            self.output_network_iteration = event.output_network_iteration
            if event.validation_loss is not None and self.iteration and self.iteration[-1] == event.iteration:
                self.validation_loss[-1] = event.validation_loss  # validated after its event went out
                self.validation_accuracy[-1] = event.validation_accuracy
                for name in self.metric_names:
                    self.validation_metrics[name][-1] = (
                        event.validation_metrics.get(name)
                        if event.validation_metrics is not None
                        else event.validation_accuracy
                        if name == "accuracy"
                        else None
                    )
        elif isinstance(event, TrainingRestarted):
            self.restarts.append(event.description)

    @property
    def final_validation_loss(self) -> float | None:
        """The validation loss of the returned network (None without validation data): see `_returned_networks`."""
        return self._returned_networks(self.validation_loss)

    @property
    def final_validation_accuracy(self) -> float | None:
        """The validation accuracy of the returned network (None without validation data or class scores)."""
        return self._returned_networks(self.validation_accuracy)

    @property
    def final_validation(self) -> dict[str, float | None]:
        """The returned network's validation figures by name: "loss" and every metric (empty without validation
        data)."""
        if self.final_validation_loss is None:
            return {}
        return {
            "loss": self.final_validation_loss,
            **{name: self._returned_networks(values) for name, values in self.validation_metrics.items()},
        }

    def _returned_networks(self, figures: list[float | None]) -> float | None:
        """The figure validated at `output_network_iteration` (the returned network's: with output_network=
        "best-validation" an earlier iteration's), else the last one computed (a run ended by a non-finite loss
        does not validate its last iteration)."""
        iteration = self.output_network_iteration
        if iteration and self.iteration and self.iteration[-1] >= iteration:
            index = len(self.iteration) - 1 - (self.iteration[-1] - iteration)  # iterations are consecutive
            if 0 <= index and self.iteration[index] == iteration and self.validation_loss[index] is not None:
                return figures[index]
        return next((v for v in reversed(figures) if v is not None), None)

    def history(self) -> dict[str, list[Any]]:
        """The per-iteration history as columns: those of _COLUMNS, then training_<metric> and
        validation_<metric> for each metric other than accuracy (a regression run has no accuracy columns)."""
        columns = {name: list(getattr(self, name)) for name in _COLUMNS}
        if "accuracy" not in self.metric_names:
            del columns["training_accuracy"], columns["validation_accuracy"]
        for name in self.metric_names:
            if name != "accuracy":
                columns[f"training_{name}"] = list(self.metrics[name])
                columns[f"validation_{name}"] = list(self.validation_metrics[name])
        return columns

    def to_dataframe(self) -> Any:
        """The history as a pandas DataFrame, one row per iteration (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is optional
            raise ImportError("info.to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.history())

    def __repr__(self) -> str:
        """The outcome by attribute name, history lists shortened (`iteration=[1, 2, ..., 184]`)."""
        parts = [f"stop_reason={self.stop_reason!r}"]
        if self.iteration:
            parts += [f"iteration={_shortened(self.iteration)}", f"training_loss={_shortened(self.training_loss)}"]
        parts += [f"hardware={self.hardware!r}", f"images_per_second={self.images_per_second:.0f}"]
        if self.final_validation_accuracy is not None:
            parts.append(f"final_validation_accuracy={self.final_validation_accuracy:.4f}")
        return f"TrainingInfo({', '.join(parts)})"

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise take any attribute name as valid

        def __getattr__(self, name: str) -> Any:
            """Only for a name that is not an attribute: AttributeError naming the attribute meant (MATLAB's
            trainInfo names, `info.TrainingLoss` -> `training_loss`, or a close one)."""
            if name.startswith("_"):  # copy and pickle ask for these before the fields exist
                raise AttributeError(name)
            snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()  # TrainingLoss -> training_loss
            known = {f.name for f in fields(TrainingInfo)} | {n for n in dir(TrainingInfo) if not n.startswith("_")}
            hint = did_you_mean(snake, known, meant=_MATLAB_NAMES)
            raise AttributeError(f"'TrainingInfo' object has no attribute {name!r}.{hint}")


# MATLAB's trainInfo names whose snake_case is not the attribute (the others are: TrainingLoss -> training_loss)
_MATLAB_NAMES = {
    "base_learn_rate": "learn_rate",
    "training_history": "history()",
    "validation_history": "history()",
}


def _shortened(values: list[Any]) -> str:
    """A history list as numpy prints a long array: `[2.31, 2.05, ..., 0.0905]` (numbers to 4 digits)."""
    shown = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in values]
    return "[" + ", ".join(shown if len(shown) <= 4 else [*shown[:2], "...", shown[-1]]) + "]"
