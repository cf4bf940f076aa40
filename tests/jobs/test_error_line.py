"""A failed job's error is one bounded line in the store (the panel polls every job every 3 s); the log keeps all."""

from __future__ import annotations

import nbscale.jobs as jobs
from nbscale.jobs.records import ERROR_CHARS

WAIT_S = 60


def test_a_2_mb_exception_is_stored_as_one_bounded_line_and_the_log_keeps_it_whole() -> None:
    job = jobs.submit("raise ValueError('x' * 2_000_000 + '\\nsecond line')\n")
    assert job.wait(WAIT_S) and job.state == "failed"
    assert len(job.error) <= ERROR_CHARS and "\n" not in job.error
    assert job.error.startswith("ValueError: xxxx") and job.error.endswith("more characters in job.log())")
    assert jobs.list_jobs()[0]["error"] == job.error
    assert "x" * 2_000_000 + "\nsecond line" in job.log()


def test_a_long_failure_reason_written_by_the_store_is_bounded_too(job_store) -> None:
    job_id = job_store.create("never ran", None, "/")
    assert job_store.fail(job_id, "its process could not start: " + "y" * 10_000)
    record = job_store.get(job_id)
    assert len(record.error) <= ERROR_CHARS and record.error.startswith("its process could not start: yyy")
    assert "y" * 10_000 in jobs.get(job_id).log()
