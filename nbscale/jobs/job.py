"""`Job`: a handle on one batch job in the store; every read asks the store, so it is never stale."""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any, overload

import cloudpickle

from nbscale.errors import JobError
from nbscale.jobs import training_record
from nbscale.jobs.backends import backend_of
from nbscale.jobs.files import append_text
from nbscale.jobs.log_text import shown_tail, shown_text
from nbscale.jobs.records import NOT_WRITTEN, error_line
from nbscale.jobs.store import ACTIVE_STATES, JobRecord, JobStore


class Job:
    """A batch job (MATLAB's `batch` job): `.state`, `.log()`, `.result(name)`, `.wait()`, `.cancel()`.

    Get one with `nbscale.jobs.get(id)` or `get(name=...)` (any kernel, any time: the state lives in the job
    store), from `nbscale.jobs.list()`, or from `nbscale.jobs.submit(...)`.
    """

    def __init__(self, job_id: int, store: JobStore | None = None) -> None:
        self.store = store or JobStore()
        self.id = int(job_id)
        self.record()  # JobError now if there is no such job

    @classmethod
    def listed(cls, job_id: int, store: JobStore) -> Job:
        """The Job of a record just read from `store` (not asked for again)."""
        job = cls.__new__(cls)
        job.store, job.id = store, job_id
        return job

    def record(self) -> JobRecord:
        """The job's current row in the store."""
        return self.store.get(self.id)

    @property
    def name(self) -> str | None:
        return self.record().name

    @property
    def state(self) -> str:
        """queued, running, finished, failed or cancelled."""
        return self.record().state

    @property
    def error(self) -> str | None:
        """Why it failed (the exception's last line, or "process died ..."), else None."""
        return self.record().error

    @property
    def started(self) -> datetime | None:
        started = self.record().started
        return datetime.fromtimestamp(started) if started is not None else None

    @property
    def elapsed_s(self) -> float | None:
        """Seconds it has run (so far, or in all once ended); None before it starts."""
        return self.record().elapsed_s

    @property
    def folder(self) -> Path:
        """The job's private folder: its log, results, and any checkpoints a training run in it writes."""
        return self.store.job_dir(self.id)

    @property
    def log_path(self) -> Path:
        return self.store.log_path(self.id)

    @property
    def result_names(self) -> tuple[str, ...]:
        """Variables the cell assigned and the job saved (filled in when the job ends)."""
        return self.record().results

    def log(self, tail: int | None = None) -> str:
        """Everything the cell printed so far (stdout and stderr, in order), after a short header, as a terminal
        shows it (a line redrawn with '\\r', such as a progress line, only as last drawn); with `tail`, only its last
        `tail` characters (read from the end of the file, however long the log has grown)."""
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise JobError(f"job.log(tail=...) takes a number of characters (>= 0) or None, not {tail!r}.")
        try:
            return shown_text(self.log_path) if tail is None else shown_tail(self.log_path, tail)
        except FileNotFoundError:
            return ""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job ends (finished, failed or cancelled); False if `timeout` seconds pass first."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout)
        ):
            raise JobError(
                f"job.wait(timeout=...) takes seconds (a number) or None to wait until the job ends, not {timeout!r}."
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while self.state in ACTIVE_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 1.5, 1.0)
        return True

    def cancel(self) -> bool:
        """Stop the job and everything it started (its whole process group); False if it had already ended."""
        record = self.record()
        if not self.store.mark_cancelled(self.id):
            return False
        if record.pid is None:  # the submitter may have recorded the process since
            record = self.record()
        backend_of(self.folder).cancel(record, self.folder)
        append_text(self.log_path, f"\n[nbscale] job {self.id} cancelled {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        return True

    def delete(self) -> None:
        """Remove the job from the store: its record, log, saved variables and checkpoints. Raises JobError while
        it is queued or running (cancel it first)."""
        record = self.record()  # a job whose process died is noticed as failed here, and can go
        if record.state in ACTIVE_STATES:
            raise JobError(
                f"Job {self.id} is still {record.state}, so it is not deleted: cancel it first (job.cancel(), "
                f"%jobs cancel {self.id}, or nbscale jobs cancel {self.id} in a terminal), then delete it."
            )
        self.store.delete(self.id)  # False only if another process deleted it meanwhile: it is gone either way

    @overload
    def result(self) -> dict[str, Any]: ...

    @overload
    def result(self, name: str) -> Any: ...

    def result(self, name: str | None = None) -> Any:
        """The value the cell assigned to `name`, unpickled from the job's folder; with no name, a dict of every
        variable the job saved, by name (MATLAB's fetchOutputs).

        Raises JobError while the job runs, and for a name the cell did not assign (listing those it did).
        """
        if name is not None and not isinstance(name, str):
            raise JobError(f"job.result(name) takes a variable's name as a string (like 'net'), not {name!r}.")
        record = self.record()
        if record.state in ACTIVE_STATES:
            raise JobError(
                f"Job {self.id} is still {record.state}; its variables are saved when it ends. Wait for it with "
                f"job.wait() (or check job.state), then call job.result({'' if name is None else repr(name)}) again."
            )
        if name is None:
            if not record.results and record.state != "finished":
                raise JobError(f"Job {self.id} saved no variable.{_how_it_ended(record)}")
            return {saved: self._load(saved) for saved in record.results}
        if name in record.unpicklable:
            raise JobError(self._unsaved_message(name, record.unpicklable[name]))
        if name not in record.results:
            saved = ", ".join(record.results) or "none"
            raise JobError(
                f"Job {self.id} did not assign {name!r}. Variables it assigned: {saved}.{_how_it_ended(record)}"
            )
        return self._load(name)

    def _load(self, name: str) -> Any:
        """The saved variable `name`, unpickled (JobError when this environment cannot load it)."""
        try:
            return cloudpickle.loads(self.store.result_path(self.id, name).read_bytes())
        except Exception as error:
            raise JobError(
                f"Job {self.id}'s saved {name!r} cannot be loaded here: {error}. Load it in an environment with "
                "the same packages as the job (the file is " + str(self.store.result_path(self.id, name)) + ")."
            ) from None

    def _unsaved_message(self, name: str, reason: str) -> str:
        """Why the assigned variable `name` was not saved, and what to do."""
        fix = (
            f"Free space where the job store is ({self.store.root}), or point NBSCALE_HOME at a larger disk, "
            "and run the job again."
            if reason.startswith(NOT_WRITTEN)
            else "Convert it to something picklable in the cell (a state_dict, a numpy array) and run the job again."
        )
        return f"Job {self.id} assigned {name!r}, but it could not be saved: {reason}. {fix}"

    @property
    def trainings(self) -> list[int]:
        """The numbers (1, 2, ...) of the `nbscale.train` runs the job has started, in order."""
        return training_record.trainings(self.folder)

    def show(self, training: int | None = None, wait: bool = False) -> None:
        """Display the live training-progress figure, info panel and Stop button of a training in this job.

        Any kernel can watch, during the run or after it: the display catches up on what already happened,
        then follows new iterations in the background (the notebook stays usable) until the training and the
        job end; the next training the job starts is shown below it. `training` picks one run by number (see
        `job.trainings`; default: the latest, or the first to start). `wait=True` follows in the cell instead,
        returning when the job ends (the kernel interrupt stops following, not the job). Stop asks the job's
        training to stop at the end of its iteration; the job goes on and saves the network as trained so far.
        """
        from nbscale import rendering

        rendering.show(self, training=training, wait=wait)

    def training_info(self, training: int | None = None) -> Any:
        """A TrainingInfo of a training in this job (default: the latest), from what it recorded so far; for a
        TrainingMonitor's loop, the monitor's history (a dict of columns, as `monitor.history` reads)."""
        from nbscale.training.info import TrainingInfo

        events = training_record.RecordReader(self._record_path(training)).read_all()
        history = training_record.monitor_history(events)
        if history is not None:
            return history
        info = TrainingInfo()
        for event in events:
            info.record(event)
        return info

    def stop_training(self, training: int | None = None) -> bool:
        """Ask a training in this job (default: the latest) to stop at the end of its current iteration, keeping
        its network (what the monitor's Stop button does); False when the job has ended."""
        if self.state not in ACTIVE_STATES:  # whether or not it trained: there is nothing left to stop
            return False
        path = self._record_path(training)
        training_record.request_stop(self.folder, int(path.stem))
        return True

    def _record_path(self, training: int | None) -> Path:
        """The record of training `training` (default: the latest); JobError when there is none."""
        if training is not None and (isinstance(training, bool) or not isinstance(training, int)):
            raise JobError(
                f"training= takes a training's number (1, 2, ... as job.trainings lists them), not {training!r}."
            )
        numbers = self.trainings
        if training is None and numbers:
            training = numbers[-1]
        if training is None or training not in numbers:
            recorded = (
                f"It recorded trainings {', '.join(map(str, numbers))}."
                if numbers
                else "It has recorded no training yet: only nbscale.train runs inside a job are recorded."
            )
            raise JobError(
                f"Job {self.id} has no training {training}. {recorded}"
                if training is not None
                else f"Job {self.id} ({self.state}) has no training to show. {recorded}"
            )
        return training_record.record_path(self.folder, training)

    def as_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready fields (as `nbscale.jobs.list_jobs()` gives them to the server extension)."""
        return _as_dict(self.record(), self.store)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and (other.id, other.store.root) == (self.id, self.store.root)

    def __hash__(self) -> int:
        return hash((self.id, self.store.root))

    def __repr__(self) -> str:
        record = self.record()
        name = f" {record.name!r}" if record.name else ""
        elapsed = f", {record.elapsed_s:.1f} s" if record.elapsed_s is not None else ""
        return f"<Job {self.id}{name}: {record.state}{elapsed}>"


def _as_dict(record: JobRecord, store: JobStore) -> dict[str, Any]:
    started = datetime.fromtimestamp(record.started).isoformat(timespec="seconds") if record.started else None
    return {
        "id": record.id,
        "name": record.name,
        "state": record.state,
        "started": started,
        "elapsed_s": round(record.elapsed_s, 3) if record.elapsed_s is not None else None,
        "pool": record.pool,
        "error": error_line(record.error),  # bounded, also for a row an earlier version stored whole
        "results": list(record.results),
        "log_path": str(store.log_path(record.id)),
        "training": _training_summary(record, store),
        "scheduler": _scheduler_state(record, store),
    }


def _scheduler_state(record: JobRecord, store: JobStore) -> str | None:
    """What SLURM says of an active SLURM job ("SLURM PENDING (Priority)"); None for other jobs and ended ones."""
    if record.state not in ACTIVE_STATES:
        return None
    job_dir = store.job_dir(record.id)
    return backend_of(job_dir).scheduler_state(job_dir)


def _training_summary(record: JobRecord, store: JobStore) -> dict[str, Any] | None:
    """A running job's latest training (epoch, iteration, loss, time left), from its record's ends; else None."""
    if record.state != "running":
        return None
    found = training_record.summary(store.job_dir(record.id))
    return found.as_dict() if found is not None else None


def _how_it_ended(record: JobRecord) -> str:
    """The sentence saying how a job that saved nothing ended: failed or cancelled ("" otherwise)."""
    return {
        "failed": f" It failed ({record.error}); job.log() shows where.",
        "cancelled": " It was cancelled before it saved any variable.",
    }.get(record.state, "")
