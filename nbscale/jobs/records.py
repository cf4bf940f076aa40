"""One job's record: read from the index with every field checked, and mirrored into the job's own folder.

The index (`jobs.sqlite`) is where states change; each change also rewrites the job folder's `record.json`, so
an index that is lost or damaged can be rebuilt from the folders (`JobStore` does it when the index is
missing). A value of the wrong type, from a damaged index or a hand-edited file, raises `DamagedRecord`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nbscale.jobs.files import write_atomic

ACTIVE_STATES = ("queued", "running")
END_STATES = ("finished", "failed", "cancelled")
RECORD_FILE = "record.json"
COLUMNS = (
    "id",
    "name",
    "state",
    "submitted",
    "started",
    "finished",
    "pid",
    "pid_started",
    "pool",
    "cwd",
    "error",
    "results",
    "unpicklable",
)
LARGEST_ID = 2**63 - 1  # SQLite's INTEGER
NOT_WRITTEN = "its file could not be written"  # how an unsaved result's reason starts when the disk refused it
ERROR_CHARS = 500  # a job's error in the store: the panel polls every job's every 3 s; the log keeps the whole text


class DamagedRecord(ValueError):
    """A record field holds something the store never writes."""


@dataclass(frozen=True)
class JobRecord:
    """One job as the store holds it."""

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
    def from_fields(cls, values: dict[str, Any]) -> JobRecord:
        """A record from the index's columns (results and unpicklable as JSON text); DamagedRecord if a field
        holds the wrong type."""
        if set(values) != set(COLUMNS):
            raise DamagedRecord(f"its fields are {sorted(values)}, not {list(COLUMNS)}")
        results, unpicklable = _json_field(values, "results"), _json_field(values, "unpicklable")
        if not isinstance(results, list) or not all(isinstance(name, str) and name.isidentifier() for name in results):
            # names become file names (results/<name>.pkl): '../x' must never pass
            raise DamagedRecord(f"results is {values['results']!r}, not a JSON list of variable names")
        if not isinstance(unpicklable, dict) or not all(isinstance(v, str) for v in unpicklable.values()):
            raise DamagedRecord(f"unpicklable is {values['unpicklable']!r}, not a JSON object of reasons")
        record = cls(**{**values, "results": tuple(results), "unpicklable": unpicklable})
        record._check()
        return record

    def _check(self) -> None:
        expected: dict[str, tuple[type, ...]] = {
            "id": (int,),
            "name": (str, type(None)),
            "state": (str,),
            "submitted": (int, float),
            "started": (int, float, type(None)),
            "finished": (int, float, type(None)),
            "pid": (int, type(None)),
            "pid_started": (int, float, type(None)),
            "pool": (int, type(None)),
            "cwd": (str,),
            "error": (str, type(None)),
        }
        for field, kinds in expected.items():
            value = getattr(self, field)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise DamagedRecord(f"{field} is {value!r} ({type(value).__name__}), which the store never writes")
        if self.state not in ACTIVE_STATES + END_STATES:
            raise DamagedRecord(f"state is {self.state!r}, not one of {', '.join(ACTIVE_STATES + END_STATES)}")
        if not 1 <= self.id <= LARGEST_ID:
            raise DamagedRecord(f"id is {self.id}, not a job number")

    def as_columns(self) -> dict[str, Any]:
        """The record as the index stores it (results and unpicklable as JSON text)."""
        values = asdict(self)
        values["results"] = json.dumps(list(self.results))
        values["unpicklable"] = json.dumps(self.unpicklable)
        return values

    @property
    def elapsed_s(self) -> float | None:
        """Seconds run so far (or in all, once ended); None before it starts."""
        if self.started is None:
            return None
        return max(0.0, (self.finished or time.time()) - self.started)


def error_line(error: str | None) -> str | None:
    """`error` as the store keeps it: its first non-empty line, at most ERROR_CHARS characters (the job's log has
    the whole text)."""
    if error is None:
        return None
    line = next((line.strip() for line in error.splitlines() if line.strip()), "")
    if len(line) <= ERROR_CHARS:
        return line
    kept = ERROR_CHARS - 60  # room for the note, which names how much was cut
    return f"{line[:kept]}... ({len(line) - kept:,} more characters in job.log())"


def _json_field(values: dict[str, Any], field: str) -> object:
    try:
        return json.loads(values[field])
    except (TypeError, ValueError):
        raise DamagedRecord(f"{field} is {values[field]!r}, not JSON text") from None


def mirror(job_dir: Path, record: JobRecord) -> None:
    """Write `record` into its job's folder (record.json, 0600, atomically)."""
    write_atomic(job_dir / RECORD_FILE, json.dumps(record.as_columns()).encode("utf-8"))


def recovered(job_dir: Path, job_id: int) -> JobRecord:
    """The record of the job in `job_dir`, from its record.json; when that is missing or damaged (a job of an
    earlier version), a failed record naming what was lost, with the variables found in results/."""
    try:
        values = json.loads((job_dir / RECORD_FILE).read_text(encoding="utf-8"))
        record = JobRecord.from_fields(values)
        if record.id == job_id:
            return record
    except (OSError, ValueError, TypeError):
        pass
    results = sorted(path.stem for path in (job_dir / "results").glob("*.pkl"))
    return JobRecord(
        id=job_id,
        name=None,
        state="failed",
        submitted=job_dir.stat().st_mtime,
        started=None,
        finished=None,
        pid=None,
        pid_started=None,
        pool=None,
        cwd="",
        results=tuple(results),
        unpicklable={},
        error="its record was lost with the job index; its log and saved variables are in its folder",
    )
