"""The job store: one folder per job beside an SQLite index of every job's state.

Where: `$NBSCALE_HOME/jobs`, or else the user's data folder (`~/.local/share/nbscale/jobs` on Linux). The
folder, each job's folder and every file in them are readable by the user only (0700 / 0600). State changes
are SQLite transactions, and every change is conditional on the state it leaves ("running" -> "finished" only
if still running), so a runner that ends as it is cancelled cannot undo the cancel, and a crash mid-write
leaves the last committed state. Nothing secret is stored: environment values never reach this file.

Job folder: `cell.py` (the code), `inputs.pkl` (variables and modules sent from the notebook), `log.txt`
(everything the cell printed), `results/<name>.pkl` (each variable the cell assigned).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbscale.errors import JobError
from nbscale.jobs import process
from nbscale.jobs.files import append_text, open_private, private_dir

ACTIVE_STATES = ("queued", "running")
END_STATES = ("finished", "failed", "cancelled")
NEVER_STARTED_S = 120.0  # a queued job with no process after this long was never launched

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT,
    state TEXT NOT NULL,
    submitted REAL NOT NULL,
    started REAL,
    finished REAL,
    pid INTEGER,
    pid_started REAL,
    pool INTEGER,
    cwd TEXT NOT NULL,
    error TEXT,
    results TEXT NOT NULL DEFAULT '[]',
    unpicklable TEXT NOT NULL DEFAULT '{}'
)
"""


def default_root() -> Path:
    """`$NBSCALE_HOME/jobs`, else the user's data folder for nbscale, `jobs` in it."""
    home = os.environ.get("NBSCALE_HOME")
    if home:
        return Path(home).expanduser() / "jobs"
    try:
        from platformdirs import user_data_dir

        return Path(user_data_dir("nbscale", appauthor=False)) / "jobs"
    except ImportError:
        data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(data_home) / "nbscale" / "jobs"


@dataclass(frozen=True)
class JobRecord:
    """One row of the index, as read."""

    id: int
    name: str | None
    state: str
    submitted: float
    started: float | None
    finished: float | None
    pid: int | None
    pid_started: float | None
    pool: int | None
    cwd: str
    error: str | None
    results: tuple[str, ...]
    unpicklable: dict[str, str]

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        values = dict(row)
        values["results"] = tuple(json.loads(values["results"]))
        values["unpicklable"] = json.loads(values["unpicklable"])
        return cls(**values)

    @property
    def elapsed_s(self) -> float | None:
        """Seconds run so far (or in all, once ended); None before it starts."""
        if self.started is None:
            return None
        return max(0.0, (self.finished or time.time()) - self.started)


class JobStore:
    """The store at `root` (default: `default_root()`), created 0700 on first use."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = private_dir(Path(root) if root is not None else default_root())
        self.index_path = self.root / "jobs.sqlite"
        if not self.index_path.exists():
            os.close(open_private(self.index_path, append=True))  # 0600 before SQLite writes a byte
        with self._transaction() as connection:
            connection.execute(_SCHEMA)

    # ---- the index ----------------------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on error)."""
        connection = sqlite3.connect(self.index_path, timeout=30, isolation_level=None)
        connection.row_factory = sqlite3.Row
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        except sqlite3.DatabaseError as error:
            raise JobError(
                f"The job store index {self.index_path} cannot be written: {error}. Check the disk and the "
                "folder's permissions, or point NBSCALE_HOME at another folder."
            ) from None
        finally:
            connection.close()

    def _update(self, job_id: int, states: tuple[str, ...], **fields: Any) -> bool:
        """Set `fields` on job `job_id` if its state is one of `states`; whether it was."""
        assignments = ", ".join(f"{column} = ?" for column in fields)
        marks = ", ".join("?" for _ in states)
        with self._transaction() as connection:
            cursor = connection.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND state IN ({marks})",
                (*fields.values(), job_id, *states),
            )
            return cursor.rowcount == 1

    def create(self, name: str | None, pool: int | None, cwd: str) -> int:
        """Add a queued job and make its private folder; returns its id."""
        with self._transaction() as connection:
            cursor = connection.execute(
                "INSERT INTO jobs (name, state, submitted, pool, cwd) VALUES (?, 'queued', ?, ?, ?)",
                (name, time.time(), pool, cwd),
            )
            job_id = int(cursor.lastrowid or 0)
        private_dir(self.job_dir(job_id))
        private_dir(self.job_dir(job_id) / "results")
        return job_id

    def set_process(self, job_id: int, pid: int, pid_started: float | None) -> None:
        """Record the process that runs the job (by the submitter, right after the spawn)."""
        self._update(job_id, ACTIVE_STATES, pid=pid, pid_started=pid_started)

    def mark_running(self, job_id: int, pid: int, pid_started: float | None) -> bool:
        """queued -> running (by the runner); False if the job was cancelled first."""
        return self._update(
            job_id, ("queued",), state="running", started=time.time(), pid=pid, pid_started=pid_started
        )

    def mark_ended(
        self, job_id: int, state: str, error: str | None, results: list[str], unpicklable: dict[str, str]
    ) -> bool:
        """running -> finished/failed with what it saved; False if it was cancelled meanwhile."""
        return self._update(
            job_id, ("running",), state=state, finished=time.time(), error=error,
            results=json.dumps(sorted(results)), unpicklable=json.dumps(unpicklable),
        )  # fmt: skip

    def mark_cancelled(self, job_id: int) -> bool:
        """queued/running -> cancelled; False if it had already ended."""
        return self._update(job_id, ACTIVE_STATES, state="cancelled", finished=time.time(), error="cancelled")

    def fail(self, job_id: int, reason: str) -> bool:
        """queued/running -> failed with `reason`, noted at the end of the log; False if it had ended."""
        if not self._update(job_id, ACTIVE_STATES, state="failed", finished=time.time(), error=reason):
            return False
        append_text(self.log_path(job_id), f"\n[nbscale] job {job_id} failed: {reason}\n")
        return True

    # ---- reading --------------------------------------------------------------------------------------------

    def _read(self, where: str = "", parameters: tuple[Any, ...] = ()) -> list[JobRecord]:
        connection = sqlite3.connect(self.index_path, timeout=30)
        connection.row_factory = sqlite3.Row
        try:
            rows = connection.execute(f"SELECT * FROM jobs {where} ORDER BY id", parameters).fetchall()
        except sqlite3.DatabaseError as error:
            raise JobError(f"The job store index {self.index_path} cannot be read: {error}.") from None
        finally:
            connection.close()
        return [JobRecord.from_row(row) for row in rows]

    def get(self, job_id: int) -> JobRecord:
        """The job's record, with a vanished process noticed; JobError if there is no such job."""
        records = self._read("WHERE id = ?", (job_id,))
        if not records:
            raise JobError(
                f"There is no job {job_id} in the job store at {self.root}. %jobs (nbscale.jobs.list_jobs()) "
                "lists the jobs there; NBSCALE_HOME selects another store."
            )
        return self._notice_death(records[0])

    def all(self) -> list[JobRecord]:
        """Every job, oldest first, with vanished processes noticed."""
        return [self._notice_death(record) for record in self._read()]

    def _notice_death(self, record: JobRecord) -> JobRecord:
        """A queued/running job whose process is gone without writing its end state has failed."""
        if record.state not in ACTIVE_STATES:
            return record
        from nbscale.jobs import ray_jobs

        ray_job = ray_jobs.reference(self.job_dir(record.id))
        if ray_job is not None:  # it runs wherever Ray put it: Ray, not a local pid, says whether it still runs
            reason = ray_jobs.ended_without_state(self.job_dir(record.id), ray_job)
            if reason is None:
                return record
        elif record.pid is not None:
            if process.alive(record.pid, record.pid_started):
                return record
            # it may have written its end state between our read and the check
            reason = "process died (killed, or the machine restarted) before the cell ended; see the log"
        elif time.time() - record.submitted > NEVER_STARTED_S:
            reason = "its process never started"
        else:
            return record
        self.fail(record.id, reason)
        return self._read("WHERE id = ?", (record.id,))[0]

    # ---- paths ----------------------------------------------------------------------------------------------

    def job_dir(self, job_id: int) -> Path:
        return self.root / str(job_id)

    def log_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / "log.txt"

    def result_path(self, job_id: int, name: str) -> Path:
        return self.job_dir(job_id) / "results" / f"{name}.pkl"
