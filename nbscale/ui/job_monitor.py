"""`job.show()` / `%jobs show ID`: a batch job's training drawn live in any kernel, from the files it records.

The job records each training's events (nbscale.jobs.training_record); the monitor reads them and feeds the
same TrainingProgress an in-notebook run draws (figure, info panel, Stop button). It catches up on what was
recorded, then polls every POLL_INTERVAL_S: in a background thread by default, so the notebook stays usable, or
in the cell with `wait=True`. The background thread's displays are sent as outputs of the cell that called
show(): JupyterLab keeps that cell listening for them until it runs again. The Stop button writes the job's stop
request (`job.stop_training`), which the job's training obeys at the end of its iteration.

Which training: the latest when show() is called, or the first to start; when it ends and the job starts
another, that one is shown below it. `training=N` shows only training N.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any

from nbscale.errors import JobError
from nbscale.jobs import training_record
from nbscale.jobs.store import ACTIVE_STATES
from nbscale.training.events import MonitorStarted, StopSignal, TrainingDone
from nbscale.ui.cell_outputs import CellOutputs, kernel_shell
from nbscale.ui.progress import TrainingProgress, format_duration
from nbscale.ui.recorded_monitor import RecordedMonitor

if TYPE_CHECKING:
    from nbscale.jobs.job import Job

POLL_INTERVAL_S = 0.5


def show_job(job: Job, training: int | None = None, wait: bool = False) -> None:
    """Display a job's training (see `Job.show`); returns once caught up, or with `wait=True` when the job ends."""
    shell = kernel_shell()
    if shell is None:
        raise JobError(
            "job.show() draws in a notebook (a Jupyter kernel). In a script, job.training_info() gives "
            "the training's history so far and job.wait() waits for the job to end."
        )
    if training is not None:
        job._record_path(training)  # JobError now for a training the job does not have
    elif not job.trainings and job.state not in ACTIVE_STATES:
        job._record_path(None)  # an ended job that trained nothing: JobError saying so
    monitor = JobMonitor(job, training)
    if monitor.step():  # caught up with an ended job
        return
    if wait:
        try:
            while not monitor.step():
                time.sleep(POLL_INTERVAL_S)
        except KeyboardInterrupt:
            monitor.say(f"Stopped following job {job.id}; the job goes on (job.show() follows it again).")
        return
    pin = CellOutputs(shell).pin  # the thread's outputs go to this cell
    threading.Thread(target=monitor.follow, args=(pin,), name=f"nbscale-job-monitor-{job.id}", daemon=True).start()


class JobMonitor:
    """Reads a job's training records and draws them; `step()` reads what is new, True once nothing more can come."""

    def __init__(self, job: Job, training: int | None) -> None:
        from IPython.display import display

        self.job, self.pinned = job, training is not None
        numbers = job.trainings
        self.number = training if training is not None else (numbers[-1] if numbers else 1)
        self.reader: training_record.RecordReader | None = None
        self.progress: JobTrainingProgress | RecordedMonitor | None = None
        self.record = job.record()  # read once a step: state, name, error
        self.said = self._header_text("catching up")
        self.header = display(_line(self.said), raw=True, display_id=True)

    def follow(self, pin: Any) -> None:
        """The background thread: step every POLL_INTERVAL_S until the job ends."""
        pin()
        try:
            while not self.step():
                time.sleep(POLL_INTERVAL_S)
        except Exception as error:  # shown where the user looks, not lost in a thread
            self.say(f"Job {self.job.id}: the monitor stopped following: {type(error).__name__}: {error}")

    def step(self) -> bool:
        """Read what the job recorded since the last step and show it; True once there is nothing more to follow."""
        self.record = self.job.record()
        active = self.record.state in ACTIVE_STATES  # first: whatever was recorded before the job ended is read below
        while True:
            if self.reader is None:
                path = training_record.record_path(self.job.folder, self.number)
                if not path.exists():
                    break
                self.reader = training_record.RecordReader(path)
                self.progress = None
            if not self._feed(self.reader.read_all()):
                break
            if self.pinned:  # its training ended: nothing more to show
                self._say_where(ended=True)
                return True
            self.reader, self.number = None, self.number + 1
        if active:
            self._say_where(ended=False)
            return False
        if self.reader is not None and self.progress is not None:
            error = self.record.error if _says_more(self.record.error, self.record.state) else None
            self.progress.job_ended(self.record.state, error)
        self._say_where(ended=True)
        return True

    def _feed(self, events: list[Any]) -> bool:
        """Give `events` to the progress display (made for the record's first event: an nbscale.train run's, or
        a TrainingMonitor's own); True when its training ended among them."""
        if self.progress is None and events:
            self.progress = self._display_for(events[0])
        if self.progress is None:
            return False
        for event in events:
            self.progress(event)
        if self.progress.done is not None:
            return True
        if self.progress.start is not None:  # each poll: the clock ticks between iterations too
            self.progress.redraw()
        return False

    def _display_for(self, first: object) -> JobTrainingProgress | RecordedMonitor:
        if isinstance(first, MonitorStarted):
            label = training_label(self.job, self.number, self.record.name)
            return RecordedMonitor(self.number, label, first, _MonitorStop(self.job, self.number))
        return JobTrainingProgress(self.job, self.number, self.record.name)

    def _say_where(self, ended: bool) -> None:
        if ended:
            self.say(self._header_text(self.record.state))
        elif self.reader is None:
            self.say(self._header_text("waiting"))
        else:
            self.say(self._header_text("following"))

    def _header_text(self, how: str) -> str:
        job, record = self.job, self.record
        name = f" {record.name!r}" if record.name else ""
        count = len(job.trainings)
        number = self.progress.number if self.progress is not None and self.reader is None else self.number
        shown = f"training {number}" + (f" of {count}" if count >= number else "")
        if how == "catching up":
            return f"Job {job.id}{name}: reading {shown}..."
        if how == "waiting":
            first = "its first training" if self.number == 1 else f"training {self.number}"
            return f"Job {job.id}{name} is {record.state}: waiting for {first} to start (nbscale.train in the job)."
        if how == "following":
            return (
                f"Job {job.id}{name}, {shown}: following live until the job ends. Stop asks the job to stop "
                "training at the end of its iteration and keep the network."
            )
        error = f" ({record.error})" if _says_more(record.error, how) else ""
        if not self.progress:
            awaited = "a training" if self.number == 1 else f"training {self.number}"
            return (
                f"Job {job.id}{name} {how}{error} without starting {awaited}: only nbscale.train runs inside a "
                "job are shown."
            )
        return f"Job {job.id}{name} {how}{error}: {shown} shown."

    def say(self, text: str) -> None:
        if text != self.said:
            self.said = text
            self.header.update(_line(text), raw=True)


class JobTrainingProgress(TrainingProgress):
    """The in-notebook display, fed from a job's record: drawn once per poll, with the job in its info panel."""

    def __init__(self, job: Job, number: int, name: str | None) -> None:
        # drawn by the monitor's polls, not per event; the figure every FIGURE_MIN_S: the job trains in another process
        super().__init__(_MonitorStop(job, number), info_interval=math.inf, budget=1.0)
        self.job, self.number = job, number
        self.label = training_label(job, number, name)
        self.done: TrainingDone | None = None
        self.job_state: str | None = None  # how the job ended, when it ended before this training did

    holds_the_cell = False  # the button stays once show()'s cell ends; the job's end removes it
    redraws_when_done = True
    stop_tooltip = (
        "Ask the job to stop training at the end of this iteration; it keeps the network trained so far (job.result)"
    )

    def redraw(self) -> None:
        if self.done is None:
            self.state = "Stopping" if self.stop.requested else "Training"
            self._draw_due(time.perf_counter())  # the info panel at each poll, the figure on its clock
        else:
            self._draw()

    def job_ended(self, state: str, error: str | None) -> None:
        """The job ended without this training's end (it failed, was cancelled, or its process died)."""
        if self.done is not None:
            return
        self.job_state = state
        self.state = f"Job {state}" + (f": {error}" if error else "")
        self._draw(final=True)
        self._close_button()

    def _info_rows(self) -> list[tuple[str, str]]:
        rows = super()._info_rows()
        rows.insert(0, ("Job", self.label))
        start, last = self.start, self.last
        if start is not None and self.done is not None:
            rows = [(k, format_duration(self.done.time_since_start) if k == "Elapsed" else v) for k, v in rows]
        elif start is not None and last is not None and last.iteration > 0 and self.job_state is None:
            total = start.max_epochs * start.iterations_per_epoch
            if not total:  # a monitor's own loop: its length is not known
                return rows
            left = (total - last.iteration) * last.time_since_start / last.iteration
            rows.insert(
                rows.index(next(row for row in rows if row[0] == "Elapsed")) + 1,
                ("Time left", f"about {format_duration(left)}"),
            )
        return rows


def training_label(job: Job, number: int, name: str | None) -> str:
    """Which training of which job a display shows: its info panel's Job row."""
    return f"{job.id}" + (f" {name!r}" if name else "") + f", training {number}"


def _says_more(error: str | None, state: str) -> bool:
    """Whether a job's error adds to its state (a cancelled job's error is often just "cancelled")."""
    return error is not None and error.strip().rstrip(".").lower() not in ("", state.lower())


class _MonitorStop(StopSignal):
    """The Stop button's signal: a request writes the job's stop file for this training."""

    def __init__(self, job: Job, number: int) -> None:
        super().__init__()
        self.job, self.number = job, number

    def request(self, reason: str) -> None:
        if not self.requested:
            training_record.request_stop(self.job.folder, self.number)
        super().request(training_record.MONITOR_STOP_REASON)


def _line(text: str) -> dict[str, str]:
    import html

    return {"text/plain": text, "text/html": f"<div style='font-size:12px'>{html.escape(text)}</div>"}
