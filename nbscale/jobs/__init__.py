"""Batch jobs (MATLAB's `batch`): run a cell detached from the kernel and collect its variables later.

```python
job = nbscale.jobs.submit("net = train()", name="long run", pool=2, namespace=globals())
nbscale.jobs.get(job.id).wait(); job.result("net")
```
`%%batch` and `%jobs` are the magic forms. State, logs and results live in the job store (`$NBSCALE_HOME/jobs`
or the user's data folder), so jobs outlive kernel restarts and closed notebooks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nbscale.jobs.job import Job, _as_dict
from nbscale.jobs.store import JobStore, default_root
from nbscale.jobs.submit import submit

__all__ = ["Job", "JobStore", "cancel", "current_job_dir", "default_root", "get", "list_jobs", "submit"]


def get(job_id: int | str) -> Job:
    """The job with this id (as shown by `%jobs`); JobError if the store has none."""
    return Job(_job_id(job_id))


def list_jobs() -> list[dict[str, Any]]:
    """Every job as a plain dict, oldest first: id, name, state, started (ISO time or None), elapsed_s,
    pool, error, results (saved variable names), log_path. JSON-ready (the server extension returns it)."""
    store = JobStore()
    return [_as_dict(record, store) for record in store.all()]


def cancel(job_id: int | str) -> bool:
    """Cancel the job (kill its process group); False if it had already ended."""
    return get(job_id).cancel()


def current_job_dir() -> Path | None:
    """Inside a batch job, its private folder (where a training run keeps its checkpoints); else None."""
    folder = os.environ.get("NBSCALE_JOB_DIR")
    return Path(folder) if folder else None


def _job_id(job_id: int | str) -> int:
    try:
        return int(job_id)
    except (TypeError, ValueError):
        from nbscale.errors import JobError

        raise JobError(f"A job id is a number as %jobs shows it (like 3), not {job_id!r}.") from None
