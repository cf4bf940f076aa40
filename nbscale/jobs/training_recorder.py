"""Inside a batch job, record a training run's events for the job monitor, and obey its Stop button.

The job runner adds `recorded_for_job_monitor` to nbscale.train's run observers (nbscale.training.run_observers),
so every run of the job's cell is wrapped in `recorded_for_job_monitor(channel, stop)`. Outside a job (no
NBSCALE_JOB_DIR, which the job's backend sets) it does nothing. Inside one, a listener on the event channel only
queues each event; a background thread appends the queue to `training/<n>.jsonl` every FLUSH_INTERVAL_S as one
write of whole lines (the format is in nbscale.jobs.training_record), and checks for `training/<n>.stop` at the
same pace, turning it into a stop request at the end of the current iteration. So the training loop never waits on the
file, whatever its iteration rate, and the record holds every event once the run ends, however it ends.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbscale.jobs.files import FILE_MODE, private_dir
from nbscale.jobs.training_record import FOLDER, MONITOR_STOP_REASON, encode, stop_path
from nbscale.notices import notices
from nbscale.training.events import EventChannel, PreparingData, StopSignal, TrainingDone

JOB_DIR_VARIABLE = "NBSCALE_JOB_DIR"
FLUSH_INTERVAL_S = 0.25


@contextlib.contextmanager
def recorded_for_job_monitor(channel: EventChannel, stop: StopSignal) -> Iterator[None]:
    """Inside a batch job: record the run's events for `%jobs show` and stop on the monitor's request."""
    job_dir = os.environ.get(JOB_DIR_VARIABLE)
    if not job_dir:
        yield
        return
    try:
        recorder = TrainingRecorder(Path(job_dir), stop)
    except OSError as error:  # the monitor is a view: the training goes on without it
        notices.warning(f"[nbscale] this training is not recorded for %jobs show: {error}")
        yield
        return
    channel.subscribe(recorder)
    try:
        yield
    finally:
        recorder.close()


class TrainingRecorder:
    """Listener that queues events; its thread writes them to the job's next `training/<n>.jsonl`."""

    def __init__(self, job_dir: Path, stop: StopSignal) -> None:
        self.job_dir, self.stop = job_dir, stop
        self.number, self.descriptor = _new_record(private_dir(job_dir / FOLDER))
        self.queue: collections.deque[Any] = collections.deque()  # appends and pops are thread-safe
        self.failed = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"nbscale-training-record-{self.number}", daemon=True)
        self._thread.start()

    def __call__(self, event: object) -> None:
        if isinstance(event, PreparingData):  # a record starts with TrainingStarted; it holds the preparation's time
            return
        if isinstance(event, TrainingDone) and self.stop.reason is not None:
            # who stopped the run, as info.stop_reason says it (a pool's workers only know "Stopped on request"):
            # the job's display reads the same reason live and when shown again later
            event = dataclasses.replace(event, stop_reason=self.stop.reason)
        self.queue.append(event)

    def _run(self) -> None:
        while not self._closing.wait(FLUSH_INTERVAL_S):
            self.flush()
            if not self.stop.requested and stop_path(self.job_dir, self.number).exists():
                self.stop.request(MONITOR_STOP_REASON)

    def flush(self) -> None:
        """Write every queued event, as one write of whole lines."""
        lines = []
        while self.queue:
            lines.append(encode(self.queue.popleft()))
        if not lines or self.failed:
            return
        data = memoryview(b"".join(lines))
        try:
            while data:
                data = data[os.write(self.descriptor, data) :]
        except OSError as error:  # a full disk: the training matters more than its record
            self.failed = True
            notices.warning(f"[nbscale] recording training {self.number} for %jobs show stopped: {error}")

    def close(self) -> None:
        """Stop the thread, write what is left, close the file."""
        self._closing.set()
        self._thread.join()
        self.flush()
        os.close(self.descriptor)


def _new_record(folder: Path) -> tuple[int, int]:
    """(n, descriptor) of a new `<n>.jsonl` after every existing one, created exclusively (two trainings that
    start together in one job, on a pool's workers say, each get their own number)."""
    number = max(
        (int(name[:-6]) for name in os.listdir(folder) if name.endswith(".jsonl") and name[:-6].isdigit()), default=0
    )
    while True:
        number += 1
        try:
            descriptor = os.open(
                folder / f"{number}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, FILE_MODE
            )
        except FileExistsError:
            continue
        os.fchmod(descriptor, FILE_MODE)
        return number, descriptor
