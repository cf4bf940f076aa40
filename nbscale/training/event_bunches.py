"""Sending a worker's training events to the notebook in bunches, so the channel carries few messages."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nbscale.training.events import PreparingData, TrainingDone, TrainingStarted

# seconds between bunches of a worker's events to the notebook (a pool's rank 0, a train_async run): the
# notebook's display hears of a run at most this late, and the channel carries at most 10 messages a second
EMIT_INTERVAL_S = 0.1


class EventBunches:
    """Buffers events and emits them as one list every `interval` seconds; start, end and PreparingData go at once."""

    def __init__(self, emit: Callable[[Any], None], interval: float = EMIT_INTERVAL_S) -> None:
        self.emit, self.interval = emit, interval
        self.buffer: list[Any] = []
        self.last = 0.0

    def send(self, event: object) -> None:
        self.buffer.extend(event if isinstance(event, list) else [event])
        now = time.perf_counter()
        # start, end and reading progress go at once: Progress already spaces its reports
        # (nbscale.data.preparing.REPORT_EVERY_S), and its last count must not wait
        if isinstance(event, TrainingStarted | TrainingDone | PreparingData) or now - self.last >= self.interval:
            self.flush()
            self.last = now

    def flush(self) -> None:
        """Emit what is buffered now (the run's end, a failure)."""
        if self.buffer:
            self.emit(self.buffer)
            self.buffer = []
