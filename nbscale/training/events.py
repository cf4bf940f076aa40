"""The one channel training events go through: plot, verbose table, output_fn and info all listen here.

Events are small picklable dataclasses, so rank 0 of a pool can send them to the notebook unchanged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TrainingStarted:
    """Sent once before the first iteration; `mini_batch_size` is the global mini-batch trained with."""

    max_epochs: int
    iterations_per_epoch: int
    mini_batch_size: int
    hardware: str
    start_time: float  # time.time()
    first_iteration: int = 1  # > 1 when resumed
    initial_learn_rate: float | None = None  # the rate used (learn_rate_scaling applied)
    choices: str = ""  # what mini_batch_size="auto" and learn_rate_scaling chose, and why; "" when nothing
    prepare_seconds: float = 0.0  # reading the data before the first iteration (not in the training's time)
    data_placement: str = ""  # where the training data are held, as the info panel says it
    compile_seconds: float = 0.0  # compile=...: compiling the step before the first iteration (not in its time)
    # the metrics' names in display order (TrainingOptions.metrics resolved: "accuracy", "rmse", a callable's
    # __name__, ...); each IterationDone's metric dicts use these keys
    metric_names: tuple[str, ...] = ("accuracy",)
    objective_metric: str = "loss"  # what validation_patience and "best-validation" follow ("loss": validation loss)
    objective_goal: str = "minimize"  # "minimize" or "maximize"


# not frozen: made every iteration, and a frozen one sets each field through object.__setattr__ (slots would refuse
# old checkpoints)
@dataclass
class IterationDone:
    """Sent after every iteration; validation figures only on iterations that validated."""

    epoch: int
    iteration: int
    time_since_start: float
    training_loss: float
    training_accuracy: float | None
    learn_rate: float
    images: int
    validation_loss: float | None = None
    validation_accuracy: float | None = None
    # every metric of TrainingStarted.metric_names by name (accuracy too, when it is one); None where not computed
    # (training_accuracy / validation_accuracy stay, equal to the "accuracy" entries)
    training_metrics: dict[str, float | None] | None = None
    validation_metrics: dict[str, float | None] | None = None


@dataclass(frozen=True)
class TrainingDone:
    """Sent once at the end, whatever ended the run."""

    stop_reason: str
    epoch: int
    iteration: int
    time_since_start: float
    output_network_iteration: int
    images_per_second: float
    # the last iteration's validation, when a stop asked as its event went out ended the run before it validated
    validation_loss: float | None = None
    validation_accuracy: float | None = None
    validation_metrics: dict[str, float | None] | None = None  # with validation_loss, every metric by name


@dataclass(frozen=True)
class TrainingRestarted:
    """Sent when a lost worker restarted the pool (on_worker_failure="restart") and training resumes.

    The next iterations are `resumed_after + 1, ...`, recomputed from that checkpoint (0: from the start); the
    listeners have seen up to `lost_after`, and are sent only the iterations after it.
    """

    resumed_after: int
    lost_after: int
    description: str  # one line: which restart, what was lost, where training resumed


@dataclass(frozen=True)
class PreparingData:
    """Sent while the data are read before training: `done` of `total` `unit` ("files" or "items") of `what`
    ("training data" or "validation data") are read. On a pool each rank counts the items it reads (its share),
    of the `total` they all read, and the notebook adds the ranks' counts up; the last count reaches `total`."""

    what: str
    done: int
    total: int
    unit: str = "items"


Event = TrainingStarted | IterationDone | TrainingDone | TrainingRestarted | PreparingData


# ---- a TrainingMonitor's events (nbscale.monitor): a user's own loop, which has no epochs or learn rate to report


@dataclass
class MetricsRead:
    """A TrainingMonitor's read: the steps recorded since the last read (as numbers, in order), each metric's
    values with the row (an index into `steps`) of each, and the info, progress and status shown with them.
    `flushed`: the read was asked for (monitor.flush(), close), so a display draws its figure now."""

    steps: list[Any]
    columns: dict[str, tuple[list[int], list[float]]]
    info: dict[str, Any]
    progress: float | None
    status: Any = None
    flushed: bool = False

    def rows(self) -> list[tuple[Any, dict[str, float]]]:
        """(step, {metric: value}) per step: what the loggers take."""
        out: list[tuple[Any, dict[str, float]]] = [(step, {}) for step in self.steps]
        for name, (rows, values) in self.columns.items():
            for row, value in zip(rows, values, strict=True):
                out[row][1][name] = value
        return out


@dataclass(frozen=True)
class PanelScale:
    """monitor.y_scale: panel `panel` (in the monitor's panel order) drawn on a log scale or not."""

    panel: int
    log: bool


@dataclass(frozen=True)
class MonitorDone:
    """A TrainingMonitor closed: "Done" or "Stopped", and who stopped it (None when nobody did); `end_time` is
    time.time() then (what a job's display shows as the monitor's elapsed time)."""

    state: str
    stop_reason: str | None
    end_time: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class MonitorStarted:
    """A TrainingMonitor's layout, told to the run observers before its first read (a %%batch job records it, so
    `job.show()` draws the monitor's own panels): its metrics, the figure's (title, metrics) panels, the x label,
    the info fields and its start (time.time())."""

    metrics: tuple[str, ...]
    panels: tuple[tuple[str, tuple[str, ...]], ...]
    x_label: str
    info_names: tuple[str, ...]
    start_time: float


MonitorEvent = MetricsRead | PanelScale | MonitorDone | MonitorStarted


class StopSignal:
    """Asks the loop to stop at the end of the current iteration; the first reason given wins. `requested` is a
    plain attribute: a loop reads it every iteration."""

    def __init__(self) -> None:
        # reentrant: the kernel interrupt's handler may ask while this thread is inside `request` (no deadlock)
        self._lock = threading.RLock()
        self.requested = False
        self.reason: str | None = None
        self.on_request: list[Callable[[], None]] = []

    def request(self, reason: str) -> None:
        """Ask the run to stop at the end of its iteration; the first reason is kept, later requests change
        nothing. Calls each of `on_request` once."""
        with self._lock:  # the Stop button's thread and the kernel interrupt may ask at once
            if self.requested:
                return
            self.reason = reason
            self.requested = True
        for callback in self.on_request:
            callback()


@dataclass
class EventChannel:
    """Fan-out of training events to listeners, in the order they subscribed."""

    listeners: list[Callable[[Any], None]] = field(default_factory=list)

    def subscribe(self, listener: Callable[[Any], None]) -> None:
        self.listeners.append(listener)

    def publish(self, event: object) -> None:
        """Hand `event` to every listener in turn (a list, item by item); a listener's exception propagates."""
        if isinstance(event, list):  # a pool worker sends its events in bunches
            for item in event:
                self.publish(item)
            return
        for listener in self.listeners:
            listener(event)
