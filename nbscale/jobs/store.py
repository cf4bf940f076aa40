"""The job store: one folder per job beside an SQLite index of every job's state.

Where: `$NBSCALE_HOME/jobs`, or else the user's data folder (`~/.local/share/nbscale/jobs` on Linux). The
folder, each job's folder and every file in them are readable by the user only (0700 / 0600). State changes
are SQLite transactions, and every change is conditional on the state it leaves ("running" -> "finished" only
if still running), so a runner that ends as it is cancelled cannot undo the cancel, and a crash mid-write
leaves the last committed state. Nothing secret is stored: environment values never reach this file.

Job folder: `cell.py` (the code), `inputs.pkl` (variables and modules sent from the notebook), `log.txt`
(everything the cell printed), `results/<name>.pkl` (each variable the cell assigned), `record.json` (the
job's row, rewritten with each state change).

A damaged index (not SQLite, emptied while job folders exist, another table layout, a field of the wrong type)
is refused with a JobError that names the file and how to recover: moved aside, the index is rebuilt from the
job folders' `record.json` on the next use. A job id is never handed out twice: a new job's id is past every
id in the index and every job folder on disk, and its folder is created (never reused) before the job exists.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from platformdirs import user_data_dir

from nbscale.errors import JobError
from nbscale.jobs.backends import backend_of
from nbscale.jobs.files import append_text, open_private, private_dir
from nbscale.jobs.records import (
    ACTIVE_STATES,
    COLUMNS,
    END_STATES,
    LARGEST_ID,
    DamagedRecord,
    JobRecord,
    error_line,
    mirror,
    recovered,
)
from nbscale.trust import posix_owners, swappable_by_others

__all__ = ["ACTIVE_STATES", "END_STATES", "JobRecord", "JobStore", "default_root"]

NEVER_STARTED_S = 120.0  # a queued job with no process after this long was never launched
FULL_DISK_BYTES = 64 * 1024  # less free space than this: a job's end state may not have fit in the index
INDEX_NAME = "jobs.sqlite"
_SQLITE_HEADER = b"SQLite format 3\x00"

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


def _roll_back(connection: sqlite3.Connection) -> None:
    """Undo the open transaction, if SQLite has not already (it does on a full disk): the error that caused it is
    the one to report, never "cannot rollback - no transaction is active"."""
    if connection.in_transaction:
        try:
            connection.execute("ROLLBACK")
        except sqlite3.DatabaseError:
            pass


def default_root() -> Path:
    """`$NBSCALE_HOME/jobs`, else the user's data folder for nbscale, `jobs` in it."""
    home = os.environ.get("NBSCALE_HOME")
    if home:
        return Path(home).expanduser() / "jobs"
    return Path(user_data_dir("nbscale", appauthor=False)) / "jobs"


def _ranges(ids: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7' (at most five runs shown)."""
    runs: list[list[int]] = []
    for job_id in ids:
        if runs and job_id == runs[-1][1] + 1:
            runs[-1][1] = job_id
        else:
            runs.append([job_id, job_id])
    shown = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:5]]
    return ", ".join(shown) + (", ..." if len(runs) > 5 else "")


class JobStore:
    """The store at `root` (default: `default_root()`), created 0700 on first use.

    Raises JobError when the index is damaged (saying how to recover) or cannot be read. A missing index
    beside job folders is rebuilt from them.
    """

    def __init__(self, root: Path | str | None = None) -> None:
        folder = Path(root) if root is not None else default_root()
        try:
            self.root = private_dir(folder)
        except OSError as error:
            raise JobError(
                f"The job store folder {folder} cannot be used ({error.strerror or error}): point "
                "NBSCALE_HOME at a folder you can write to."
            ) from None
        owner = self.root.stat().st_uid
        if posix_owners() and owner != os.getuid():  # its pickles are unpickled here: they must be ours alone
            raise JobError(
                f"The job store folder {self.root} belongs to another user (uid {owner}), who could put "
                "files there that run as you when read: point NBSCALE_HOME at a folder of your own."
            )
        swappable = swappable_by_others(self.root)
        if swappable:  # they could swap the store for theirs between this check and a read of its pickles
            raise JobError(
                f"The job store folder {self.root} cannot be trusted: {swappable}, who could replace the "
                "store with one whose files run as you when read. Point NBSCALE_HOME at a folder only you "
                "can write to, or make the folder named yours alone (chmod go-w)."
            )
        self.index_path = self.root / INDEX_NAME
        try:
            self._open_index()
        except OSError as error:  # the index is a folder, unreadable, or the disk failed
            raise JobError(
                f"The job store index {self.index_path} cannot be read ({error.strerror or error}): "
                "check the file and the folder's permissions, or point NBSCALE_HOME at another "
                "folder."
            ) from None

    # ---- the index ----------------------------------------------------------------------------------------

    def _open_index(self) -> None:
        """Check the index before any use; create it (empty) or rebuild it (from the folders) when missing."""
        try:
            size = self.index_path.stat().st_size
        except FileNotFoundError:
            size = None
        folders = self.job_ids_on_disk()
        if size is None and folders:
            self._rebuild(folders)
        elif size is None:
            os.close(open_private(self.index_path, append=True))  # 0600 before SQLite writes a byte
        elif size == 0 and folders:
            these = f"job folder {folders[0]} exists" if len(folders) == 1 else f"job folders {_ranges(folders)} exist"
            raise self._damaged(f"it is empty (0 bytes) while {these} beside it")
        elif size > 0:
            with open(self.index_path, "rb") as index:
                start = index.read(len(_SQLITE_HEADER))
            if start != _SQLITE_HEADER:
                raise self._damaged(f"it is not an SQLite database (it starts with {start[:16]!r})")
        columns = self._columns()
        if not columns:
            with self._transaction() as connection:
                connection.execute(_SCHEMA)
        elif columns != COLUMNS:
            raise self._damaged(f"its jobs table has the columns {list(columns)}, not {list(COLUMNS)}")
        else:
            self._read()  # every row checked: one the store never wrote means the file is not to be trusted

    def _columns(self) -> tuple[str, ...]:
        connection = sqlite3.connect(self.index_path, timeout=30)
        try:
            return tuple(row[1] for row in connection.execute("PRAGMA table_info(jobs)"))
        except sqlite3.DatabaseError as error:
            raise self._database_error(error, "read") from None
        finally:
            connection.close()

    def _damaged(self, what: str) -> JobError:
        return JobError(
            f"The job store index {self.index_path} is damaged: {what}. nbscale does not use it, so that no job's "
            f"id or folder is handed out again. Move it aside (mv '{self.index_path}' "
            f"'{self.index_path}.damaged'): the next use rebuilds the index from the job folders in {self.root} "
            "(each keeps its job's record in record.json)."
        )

    def _database_error(self, error: sqlite3.DatabaseError, doing: str) -> JobError:
        """A JobError for an SQLite error: damage (the file's content) or the environment (locks, disk, rights)."""
        if not isinstance(error, sqlite3.OperationalError):  # "file is not a database", "malformed", ...
            return self._damaged(str(error))
        return JobError(
            f"The job store index {self.index_path} cannot be {doing}: {error}. Check the disk and the folder's "
            "permissions, or point NBSCALE_HOME at another folder."
        )

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
                _roll_back(connection)
                raise
            try:
                connection.execute("COMMIT")
            except sqlite3.DatabaseError:
                _roll_back(connection)
                raise
        except sqlite3.DatabaseError as error:
            raise self._database_error(error, "written") from None
        finally:
            connection.close()

    def _update(self, job_id: int, states: tuple[str, ...], **fields: object) -> bool:
        """Set `fields` on job `job_id` if its state is one of `states` (and mirror it); whether it was."""
        assignments = ", ".join(f"{column} = ?" for column in fields)
        marks = ", ".join("?" for _ in states)
        with self._transaction() as connection:
            cursor = connection.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ? AND state IN ({marks})",
                (*fields.values(), job_id, *states),
            )
            if cursor.rowcount != 1:
                return False
            self._mirror(connection, job_id)
        return True

    def _mirror(self, connection: sqlite3.Connection, job_id: int) -> None:
        """Copy the job's row into its folder, inside the transaction that changed it (so copies keep its order).

        A folder deleted by hand gets no copy (and is not made again: a job folder is never reused); the index alone
        then holds the job's state, so the state change still happens and the store stays readable."""
        row = connection.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if self.job_dir(job_id).is_dir():
            try:
                mirror(self.job_dir(job_id), self._record(row))
            except OSError:  # a full disk: the index, which is the truth, still changes; the copy stays as it was
                pass

    def _rebuild(self, job_ids: list[int]) -> None:
        """A new index holding the record of every job folder, put in place only if no index appeared meanwhile."""
        temporary = self.root / f".{INDEX_NAME}.rebuild-{os.getpid()}"
        temporary.unlink(missing_ok=True)
        os.close(open_private(temporary))
        try:
            connection = sqlite3.connect(temporary)
            try:
                connection.execute(_SCHEMA)
                for job_id in job_ids:
                    values = recovered(self.job_dir(job_id), job_id).as_columns()
                    connection.execute(
                        f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})",
                        [values[c] for c in COLUMNS],
                    )
                connection.commit()
            finally:
                connection.close()
            try:
                os.link(temporary, self.index_path)  # never over an index another process made meanwhile
            except FileExistsError:
                pass
        finally:
            temporary.unlink(missing_ok=True)

    def job_ids_on_disk(self) -> list[int]:
        """The ids of the job folders in the store, ascending (folders named by a job number)."""
        ids = []
        for entry in os.scandir(self.root):
            if entry.name.isdigit() and entry.name.isascii() and entry.is_dir(follow_symlinks=False):
                job_id = int(entry.name)
                if 1 <= job_id <= LARGEST_ID:
                    ids.append(job_id)
        return sorted(ids)

    def create(self, name: str | None, pool: int | None, cwd: str) -> int:
        """Add a queued job and make its private folder; returns its id.

        The id is past every id the index has given (deleted rows included) and every job folder on disk, and
        its folder is new: an existing folder is never reused.
        """
        if name is not None and not isinstance(name, str):
            raise JobError(f"A job's name is a string (or None), not {type(name).__name__} {name!r}.")
        made: list[Path] = []
        try:
            with self._transaction() as connection:
                given: int = connection.execute(
                    "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0), "
                    "coalesce((SELECT max(id) FROM jobs), 0))"
                ).fetchone()[0]
                job_id = max(given, *self.job_ids_on_disk(), 0) + 1
                while True:
                    try:
                        self.job_dir(job_id).mkdir(mode=0o700)
                        made.append(self.job_dir(job_id))
                        break
                    except FileExistsError:  # made by something else since we listed: never reuse it
                        job_id += 1
                connection.execute(
                    "INSERT INTO jobs (id, name, state, submitted, pool, cwd) VALUES (?, ?, 'queued', ?, ?, ?)",
                    (job_id, name, time.time(), pool, cwd),
                )
                private_dir(self.job_dir(job_id))
                private_dir(self.job_dir(job_id) / "results")
                self._mirror(connection, job_id)
        except BaseException:  # the row was not written (a full disk): its new folder must not stay behind
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        return job_id

    def set_process(self, job_id: int, pid: int, pid_started: float | None) -> None:
        """Record the process that runs the job (by the submitter, right after the spawn)."""
        self._update(job_id, ACTIVE_STATES, pid=pid, pid_started=pid_started)

    def mark_running(self, job_id: int, pid: int, pid_started: float | None) -> bool:
        """queued -> running (by the runner); False if the job was cancelled first."""
        return self._update(job_id, ("queued",), state="running", started=time.time(), pid=pid, pid_started=pid_started)

    def mark_ended(
        self, job_id: int, state: str, error: str | None, results: list[str], unpicklable: dict[str, str]
    ) -> bool:
        """running -> finished/failed with what it saved; False if it was cancelled meanwhile."""
        return self._update(
            job_id,
            ("running",),
            state=state,
            finished=time.time(),
            error=error_line(error),
            results=json.dumps(sorted(results)),
            unpicklable=json.dumps(unpicklable),
        )

    def mark_cancelled(self, job_id: int) -> bool:
        """queued/running -> cancelled; False if it had already ended."""
        return self._update(job_id, ACTIVE_STATES, state="cancelled", finished=time.time(), error="cancelled")

    def fail(self, job_id: int, reason: str) -> bool:
        """queued/running -> failed with `reason` (its first line, bounded, in the store; all of it at the end of the
        log); False if it had ended. Raises JobError when the index cannot be written."""
        if not self._update(job_id, ACTIVE_STATES, state="failed", finished=time.time(), error=error_line(reason)):
            return False
        if self.job_dir(job_id).is_dir():
            try:
                append_text(self.log_path(job_id), f"\n[nbscale] job {job_id} failed: {reason}\n")
            except OSError:  # a full disk: the state is what matters, and it is written
                pass
        return True

    def delete(self, job_id: int) -> bool:
        """Remove an ended job: its row and its folder (log, results, checkpoints). False if it is not in the store
        or is still queued or running (cancel it first). The folder is renamed aside in the transaction that drops
        the row, then removed: a crash in between leaves a hidden `.deleted-*` folder (removed by the next delete),
        never a row without its folder or a folder that looks like a job."""
        trash = self.root / f".deleted-{job_id}-{os.getpid()}"
        marks = ", ".join("?" for _ in END_STATES)
        with self._transaction() as connection:
            cursor = connection.execute(f"DELETE FROM jobs WHERE id = ? AND state IN ({marks})", (job_id, *END_STATES))
            if cursor.rowcount != 1:
                return False
            try:
                os.rename(self.job_dir(job_id), trash)
            except FileNotFoundError:  # deleted by hand already: the row goes alone
                pass
            except OSError as error:
                raise JobError(
                    f"Job {job_id}'s folder {self.job_dir(job_id)} cannot be deleted "
                    f"({error.strerror or error}): check the job store folder's permissions."
                ) from None
        for leftover in self.root.glob(".deleted-*"):  # this one, and any a crashed delete left
            shutil.rmtree(leftover, ignore_errors=True)
        return True

    # ---- reading --------------------------------------------------------------------------------------------

    def _read(self, where: str = "", parameters: tuple[Any, ...] = ()) -> list[JobRecord]:
        connection = sqlite3.connect(self.index_path, timeout=30)
        connection.row_factory = sqlite3.Row
        try:
            rows = connection.execute(f"SELECT * FROM jobs {where} ORDER BY id", parameters).fetchall()
        except sqlite3.DatabaseError as error:
            raise self._database_error(error, "read") from None
        finally:
            connection.close()
        return [self._record(row) for row in rows]

    def _record(self, row: sqlite3.Row) -> JobRecord:
        try:
            return JobRecord.from_fields(dict(row))
        except DamagedRecord as damage:
            raise self._damaged(f"the row of job {row['id']!r} is not one nbscale wrote ({damage})") from None

    def get(self, job_id: int) -> JobRecord:
        """The job's record, with a vanished process noticed; JobError if there is no such job."""
        if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= LARGEST_ID:
            shown = repr(job_id) if len(repr(job_id)) <= 40 else f"{repr(job_id)[:37]}..."
            raise JobError(
                f"There is no job {shown} in the job store at {self.root}: job ids are the numbers "
                "%jobs (nbscale.jobs.list()) shows."
            )
        records = self._read("WHERE id = ?", (job_id,))
        if not records:
            raise JobError(
                f"There is no job {job_id} in the job store at {self.root}. %jobs (nbscale.jobs.list()) "
                "lists the jobs there; NBSCALE_HOME selects another store."
            )
        return self._notice_death(records[0])

    def named(self, name: str) -> list[JobRecord]:
        """The jobs named `name`, oldest first, with vanished processes noticed."""
        return [self._notice_death(record) for record in self._read("WHERE name = ?", (name,))]

    def all(self) -> list[JobRecord]:
        """Every job, oldest first, with vanished processes noticed."""
        return [self._notice_death(record) for record in self._read()]

    def _notice_death(self, record: JobRecord) -> JobRecord:
        """A queued/running job whose process is gone without writing its end state has failed."""
        if record.state not in ACTIVE_STATES:
            return record
        job_dir = self.job_dir(record.id)
        reason = backend_of(job_dir).vanished(record, job_dir, NEVER_STARTED_S)
        if reason is None:
            return record
        reason = self.folder_gone(record.id) or reason  # the likelier cause: the runner could not write its end
        if shutil.disk_usage(self.root).free < FULL_DISK_BYTES:
            reason += (
                "; the job store's disk is full, so it may have ended without being able to record it: free "
                f"space in {self.root}"
            )
        try:
            self.fail(record.id, reason)  # only if still active: an end state written meanwhile stays
        except JobError:  # the index cannot be written (a full disk): a read never depends on a write succeeding
            return replace(record, state="failed", finished=self._last_sign_of_life(record), error=error_line(reason))
        return self._read("WHERE id = ?", (record.id,))[0]

    def _last_sign_of_life(self, record: JobRecord) -> float:
        """When a job whose death could not be written was last heard of: its log's last change, else now."""
        try:
            return max(self.log_path(record.id).stat().st_mtime, record.started or record.submitted)
        except OSError:
            return time.time()

    def folder_gone(self, job_id: int) -> str | None:
        """Why job `job_id` lost its results when its folder was deleted while it was active; None if the folder is
        there."""
        if self.job_dir(job_id).is_dir():
            return None
        return (
            f"its folder {self.job_dir(job_id)} was deleted while the job was active, and its log and saved "
            "variables with it; run the job again"
        )

    # ---- paths ----------------------------------------------------------------------------------------------

    def job_dir(self, job_id: int) -> Path:
        return self.root / str(job_id)

    def log_path(self, job_id: int) -> Path:
        return self.job_dir(job_id) / "log.txt"

    def result_path(self, job_id: int, name: str) -> Path:
        return self.job_dir(job_id) / "results" / f"{name}.pkl"
