"""The interface every batch-job backend implements: launch a job's runner, tell whether it ended without saying
so, and cancel it.

Whatever the backend, a job runs `python -m nbscale.jobs.runner <job folder>`, whose output goes to the job's
log, and the runner itself writes the job's states to the store. A backend only starts that process where it
runs, knows how to find out that it vanished, and how to stop it. Nothing above (submit, the store, Job) asks
which backend runs a job; a new place to run jobs is one more module here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from nbscale.errors import JobError
from nbscale.jobs.records import JobRecord


class LaunchFailed(JobError):
    """The backend could not start the job: the message is the user's; `reason` is the store's one-line why."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Launch:
    """What a backend needs to start one job's runner."""

    job_id: int
    job_dir: Path
    log: Path  # the runner's stdout and stderr are appended here
    cwd: str  # where the cell runs
    env: dict[str, str] = field(default_factory=dict)  # set in the runner's environment only: never stored
    pool: int | None = None  # the job opens a pool of this many workers


class JobBackend(ABC):
    """Starts, follows and cancels the runner processes of batch jobs."""

    name: str = "backend"

    @abstractmethod
    def launch(self, launch: Launch) -> tuple[int, float | None] | None:
        """Start the job's runner. Returns (pid, start time) of a runner on this machine, for the store to
        follow; None where the backend follows the job by other means. Raises LaunchFailed."""

    @abstractmethod
    def vanished(self, record: JobRecord, job_dir: Path, launch_timeout_s: float) -> str | None:
        """Why an active job's runner is gone without writing the job's end state (for the store's record);
        None while it may still run. `launch_timeout_s`: how long a job may wait for its runner to start."""

    @abstractmethod
    def cancel(self, record: JobRecord, job_dir: Path) -> None:
        """Stop the job's runner and everything it started (the store already says cancelled)."""

    def scheduler_state(self, job_dir: Path) -> str | None:
        """What the cluster's scheduler says of an active job ("SLURM PENDING (Priority)"), for %jobs; None where
        no scheduler is asked."""
        return None
