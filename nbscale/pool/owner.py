"""Whose pool it is, as the JupyterLab panel names it: the notebook its kernel runs (Jupyter's server tells a kernel
its session's path in JPY_SESSION_NAME) or the batch job it runs in (NBSCALE_JOB_DIR, set by the job's backend)."""

from __future__ import annotations

import json
import os
from pathlib import Path

MAX_NAME_CHARS = 200  # a path or job name is shown in a narrow panel: a longer one is cut


def pool_owner() -> dict[str, str | int | None]:
    """`notebook` (its path, else None), `job_id` and `job_name` (inside a batch job, else None)."""
    notebook = os.environ.get("JPY_SESSION_NAME") or None
    job_id, job_name = _job()
    return {"notebook": _short(notebook), "job_id": job_id, "job_name": _short(job_name)}


def _job() -> tuple[int | None, str | None]:
    folder = os.environ.get("NBSCALE_JOB_DIR")
    if not folder or not Path(folder).name.isdigit():
        return None, None
    try:  # the job's record.json (nbscale.jobs.records mirrors it there); its name is optional
        record = json.loads((Path(folder) / "record.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    name = record.get("name") if isinstance(record, dict) else None
    return int(Path(folder).name), name if isinstance(name, str) else None


def _short(text: str | None) -> str | None:
    return text if text is None or len(text) <= MAX_NAME_CHARS else "…" + text[-(MAX_NAME_CHARS - 1) :]
