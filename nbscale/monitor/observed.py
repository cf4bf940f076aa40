"""A TrainingMonitor watched by the run observers (nbscale.training.run_observers) as nbscale.train's runs are:
inside a %%batch job the runner's recorder writes the run for `%jobs show`, and its Stop sets `monitor.stop`.

The observers listen to nbscale.train's events, and the job's record holds only those; so, while any observer
listens, each read is told them as iterations: a step as the iteration, "loss" as the loss, every other metric by
name, the info's `epoch` and `learn_rate` where the loop shows them (else epoch 1 and no learn rate, 0).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from nbscale.training.events import (
    EventChannel,
    IterationDone,
    MetricsRead,
    MonitorDone,
    TrainingDone,
    TrainingStarted,
)
from nbscale.training.run_observers import observed_run

if TYPE_CHECKING:
    from nbscale.monitor.producer import Producer

HARDWARE = "your own loop (nbscale.TrainingMonitor)"


@contextlib.contextmanager
def observed_as_training(monitor: Producer) -> Iterator[None]:
    """Every run observer entered around the monitor's life, with a training channel of its own and the
    monitor's stop; when one listens, the monitor's reads go there as training events, and the process's end
    closes the monitor (a job's record gets its end)."""
    channel = EventChannel()
    with observed_run(channel, monitor.stop_signal):
        if not channel.listeners:  # nobody watches (outside a job): nothing to translate
            yield
            return
        monitor.events.subscribe(AsTrainingEvents(monitor, channel))
        atexit.register(monitor.close)
        try:
            yield
        finally:
            atexit.unregister(monitor.close)


class AsTrainingEvents:
    """Listener: the monitor's events told on `channel` as a training run's (TrainingStarted at once)."""

    def __init__(self, monitor: Producer, channel: EventChannel) -> None:
        self.channel = channel
        self.names = tuple(name for name in monitor.metrics if name != "loss")
        self.start = time.time()
        self.last_step = 0
        channel.publish(TrainingStarted(1, 0, 0, HARDWARE, self.start, metric_names=self.names))

    def __call__(self, event: object) -> None:
        if isinstance(event, MetricsRead) and event.steps:
            self.channel.publish(self._iterations(event))
        elif isinstance(event, MonitorDone):
            seconds = time.time() - self.start
            reason = event.stop_reason or event.state
            self.channel.publish(TrainingDone(reason, 1, self.last_step, seconds, self.last_step, 0.0))

    def _iterations(self, read: MetricsRead) -> list[IterationDone]:
        epoch = read.info.get("epoch", 1)
        epoch = epoch if isinstance(epoch, int) else 1
        learn_rate = float(read.info.get("learn_rate", 0.0) or 0.0)
        seconds = time.time() - self.start
        out = []
        for step, values in read.rows():
            loss = values.get("loss", math.nan)
            metrics: dict[str, float | None] = {name: values[name] for name in self.names if name in values}
            out.append(IterationDone(epoch, int(step), seconds, loss, None, learn_rate, 0, training_metrics=metrics))
        self.last_step = int(read.steps[-1])
        return out
