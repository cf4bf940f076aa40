"""Batch jobs (MATLAB's `batch`): run a cell detached from the kernel and collect its variables later.

```python
job = nbscale.jobs.submit("net = train()", name="long run", pool=2, namespace=globals())
nbscale.jobs.get(job.id).wait(); job.result("net")
nbscale.jobs.get(name="long run")          # the newest job of that name
[(j.id, j.name, j.state) for j in nbscale.jobs.list()]
```
`%%batch` and `%jobs` are the magic forms. State, logs and results live in the job store (`$NBSCALE_HOME/jobs`
or the user's data folder), so jobs outlive kernel restarts and closed notebooks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from nbscale.errors import JobError
from nbscale.jobs import arguments
from nbscale.jobs.job import Job, _as_dict
from nbscale.jobs.records import ACTIVE_STATES, END_STATES
from nbscale.jobs.store import JobStore, default_root
from nbscale.jobs.submit import submit
from nbscale.suggestions import did_you_mean

__all__ = [
    "Job",
    "JobStore",
    "all_jobs",
    "cancel",
    "current_job_dir",
    "default_root",
    "delete",
    "get",
    "list",
    "list_jobs",
    "submit",
]


def get(job_id: int | str | None = None, *, name: str | None = None) -> Job:
    """The job with this id (as `%jobs` shows it), or the newest job named `name`; JobError if there is none."""
    if (job_id is None) == (name is None):
        raise JobError("nbscale.jobs.get() takes a job id (get(3)) or a name (get(name='long run')), one of them.")
    if name is None:
        return Job(arguments.job_id(job_id))
    store = JobStore()
    named = store.named(arguments.job_name(name))
    if not named:
        hint = did_you_mean(name, sorted({r.name for r in store.all() if r.name}), n=3)
        raise JobError(
            f"There is no job named {name!r} in the job store at {store.root}.{hint} %jobs lists the "
            "jobs with their names."
        )
    return Job(named[-1].id, store)


def all_jobs() -> list[Job]:
    """Every job in the store as a Job (`.id`, `.name`, `.state`, ...), oldest first; `nbscale.jobs.list()`."""
    store = JobStore()
    return [Job.listed(record.id, store) for record in store.all()]


def __getattr__(name: str) -> Callable[[], list[Job]]:
    """`nbscale.jobs.list`, the API's name for `all_jobs`, looked up here so that no `list` hides the builtin."""
    if name == "list":
        return all_jobs
    raise AttributeError(f"module 'nbscale.jobs' has no attribute {name!r}")


def list_jobs() -> list[dict[str, Any]]:
    """Every job as a plain dict, oldest first: id, name, state, started (ISO time or None), elapsed_s,
    pool, error, results (saved variable names), log_path. JSON-ready (the server extension returns it)."""
    store = JobStore()
    return [_as_dict(record, store) for record in store.all()]


def cancel(job_id: int | str) -> bool:
    """Cancel the job (kill its process group); False if it had already ended."""
    return get(job_id).cancel()


def delete(*job_ids: int | str, older_than: str | timedelta | None = None) -> list[int]:
    """Remove jobs from the store (record, log, saved variables, checkpoints); returns the ids removed.

    `delete(3, 4)`: those jobs; JobError, and nothing removed, if one does not exist or is still queued or running
    (cancel it first). `delete(older_than="7d")` (or '12h', '30m', a timedelta): every ended job that ended longer
    ago than that; active jobs are left alone.
    """
    if bool(job_ids) == (older_than is not None):
        raise JobError(
            "nbscale.jobs.delete() takes job ids (delete(3, 4)) or an age (delete(older_than='7d')), one of them."
        )
    store = JobStore()
    if older_than is not None:
        cutoff = time.time() - arguments.age_s(older_than)
        chosen = [
            record
            for record in store.all()
            if record.state in END_STATES and (record.finished or record.submitted) < cutoff
        ]
    else:
        chosen = [Job(arguments.job_id(job_id), store).record() for job_id in dict.fromkeys(job_ids)]
        active = [record for record in chosen if record.state in ACTIVE_STATES]
        if active:
            shown = ", ".join(f"{record.id} ({record.state})" for record in active)
            first = active[0].id
            raise JobError(
                f"Job{'s' if len(active) > 1 else ''} {shown} {'are' if len(active) > 1 else 'is'} still "
                f"active, so nothing was deleted: cancel first (nbscale.jobs.cancel({first}), %jobs cancel "
                f"{first}), then delete."
            )
    return [record.id for record in chosen if store.delete(record.id)]


def current_job_dir() -> Path | None:
    """Inside a batch job, its private folder (where a training run keeps its checkpoints); else None."""
    folder = os.environ.get("NBSCALE_JOB_DIR")
    return Path(folder) if folder else None
