"""Every jobs test uses its own job store (NBSCALE_HOME in a tmp folder), kernels included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nbscale.jobs import JobStore, cancel, list_jobs


@pytest.fixture(autouse=True)
def job_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobStore]:
    """NBSCALE_HOME set before any kernel starts, so kernels and this process share the store."""
    home = tmp_path / "nbscale-home"
    monkeypatch.setenv("NBSCALE_HOME", str(home))
    store = JobStore()
    yield store
    for job in list_jobs():  # no job outlives its test
        if job["state"] in ("queued", "running"):
            cancel(job["id"])
